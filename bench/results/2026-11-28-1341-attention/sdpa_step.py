
import sys, time, torch, torch.nn.functional as F
B, H, T, D, prec, mode, threads, iters, warmup = sys.argv[1:]
B, H, T, D, threads, iters, warmup = map(int, (B, H, T, D, threads, iters, warmup))
torch.set_num_threads(threads)
dt = torch.bfloat16 if prec == "bf16" else torch.float32
g = torch.Generator().manual_seed(0)
if mode == "infer":
    q, k, v = [torch.randn(B, H, T, D, generator=g).to(dt) for _ in range(3)]
    def step():
        with torch.inference_mode():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
else:
    q, k, v = [torch.randn(B, H, T, D, generator=g).to(dt).requires_grad_() for _ in range(3)]
    t = torch.randn(B, H, T, D, generator=g).to(dt)
    opt = torch.optim.SGD([q, k, v], lr=0.1)
    def step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        F.mse_loss(o, t).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
for _ in range(warmup):
    step()
ts = []
for _ in range(iters):
    t0 = time.perf_counter()
    step()
    ts.append((time.perf_counter() - t0) * 1e3)
ts.sort()
print("step_ms: %.4f" % ts[len(ts) // 2])
print("step_ms_min: %.4f" % ts[0])
print("step_ms_max: %.4f" % ts[-1])
print("torch: %s" % torch.__version__)
