"""The model zoo: small PyTorch models from torchvision, timm and transformers.

tests/zoo/run.py walks ZOO (or picks one entry with by_name), calls
spec.build(seed) to get a Case, exports case.model to tfuse with case.inputs,
runs it and takes one training step, and compares the loss, outputs and
gradients with PyTorch in float64:

    case = by_name("resnet18").build(0)
    out = case.model(**case.inputs) if isinstance(case.inputs, dict) \\
        else case.model(*case.inputs)
    loss = case.loss_fn(out, *case.targets)

Every build seeds torch before creating weights and data, nothing is
downloaded, and every dropout / stochastic-depth / layer-drop rate is 0, so
a model in train mode is deterministic and two builds with one seed are
identical. Sizes are cut down (batch 2; 64x64 images, 32x32 for the tiny
ViT/Swin/Mixer configs, 80x80 for Inception v3; tiny transformer configs)
so that one PyTorch forward+backward takes well under a second.

Vision models return logits and are scored with cross-entropy on 10 classes;
weights a library zero-initialises on purpose are made random (see wake).
transformers models compute their own loss: `labels` is in the input dict,
targets is empty and loss_fn picks out.loss. Most use the eager attention
implementation (plain matmul/softmax); a few use "sdpa" so that
scaled_dot_product_attention is covered as well.
"""
import torch
import torch.nn.functional as F


class Case:
    def __init__(self, model, inputs, targets=(), loss_fn=None):
        self.model = model
        self.inputs = inputs
        self.targets = tuple(targets)
        self.loss_fn = loss_fn


class Spec:
    def __init__(self, name, source, family, build):
        self.name, self.source, self.family, self.build = name, source, family, build

    def __repr__(self):
        return f"Spec({self.name!r}, {self.source!r}, {self.family!r})"


ZOO = []


def add(name, source, family, build):
    ZOO.append(Spec(name, source, family, build))


def by_name(name):
    for s in ZOO:
        if s.name == name:
            return s
    raise KeyError(f"no zoo model {name!r}")


# ---------------------------------------------------------------- vision

BATCH, CLASSES = 4, 10


def wake(model):
    """Re-initialise weights that a library zeroes on purpose: classifier heads
    (torchvision ViT, timm MLP-Mixer/Swin) and the last BatchNorm of residual
    branches (timm zero_init_last, LeViT). Left at zero they make the logits,
    or every gradient below them, exactly zero, which would test nothing."""
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.nn.Parameter) and not w.detach().any():
            with torch.no_grad():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    w.fill_(1.0)
                elif isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                    torch.nn.init.normal_(w, std=0.02)
    return model


def vision(make, size=64):
    """build(seed) for an image classifier make() taking (BATCH, 3, size, size)."""
    def build(seed):
        torch.manual_seed(seed)
        model = wake(make())
        x = torch.randn(BATCH, 3, size, size)
        y = torch.randint(0, CLASSES, (BATCH,))
        return Case(model, (x,), (y,), F.cross_entropy)
    return build


def tv(name, family, size=64, **kw):
    """A torchvision.models builder by name, random weights, 10 classes."""
    def make():
        import torchvision.models as tvm
        return getattr(tvm, name)(weights=None, num_classes=CLASSES, **kw)
    add(name, "torchvision", family, vision(make, size))


def tv_class(name, family, cls_path, size=64, **kw):
    """A torchvision model class (module.Class) built with a small config."""
    def make():
        import importlib
        mod, cls = cls_path.rsplit(".", 1)
        return getattr(importlib.import_module(mod), cls)(num_classes=CLASSES, **kw)
    add(name, "torchvision", family, vision(make, size))


tv("resnet18", "ResNet")
tv("resnet50", "ResNet (bottleneck)")
tv("resnext50_32x4d", "ResNeXt")
tv("wide_resnet50_2", "Wide ResNet")
tv("vgg11_bn", "VGG", dropout=0.0)
tv("alexnet", "AlexNet", dropout=0.0)
tv("squeezenet1_0", "SqueezeNet", dropout=0.0)
tv("squeezenet1_1", "SqueezeNet", dropout=0.0)
tv("densenet121", "DenseNet")
tv("googlenet", "GoogLeNet", aux_logits=False, init_weights=True, dropout=0.0)
tv("inception_v3", "Inception v3", size=80,  # needs >= 75x75
   aux_logits=False, init_weights=True, dropout=0.0)
tv("mobilenet_v2", "MobileNetV2", dropout=0.0)
tv("mobilenet_v3_small", "MobileNetV3", dropout=0.0)
tv("mobilenet_v3_large", "MobileNetV3", dropout=0.0)
tv("mnasnet0_5", "MNASNet", dropout=0.0)
tv("shufflenet_v2_x0_5", "ShuffleNetV2")
tv("efficientnet_b0", "EfficientNet", dropout=0.0, stochastic_depth_prob=0.0)
tv("efficientnet_v2_s", "EfficientNetV2", dropout=0.0, stochastic_depth_prob=0.0)
tv("regnet_x_400mf", "RegNetX")
tv("regnet_y_400mf", "RegNetY")
tv("convnext_tiny", "ConvNeXt", stochastic_depth_prob=0.0)
tv_class("vit", "ViT", "torchvision.models.VisionTransformer", size=32,
         image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
         mlp_dim=64, dropout=0.0, attention_dropout=0.0)
tv_class("swin", "Swin Transformer", "torchvision.models.swin_transformer.SwinTransformer",
         patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
         window_size=[4, 4], stochastic_depth_prob=0.0)


def _swin_v2(**kw):
    from torchvision.models.swin_transformer import (
        SwinTransformer, SwinTransformerBlockV2, PatchMergingV2)
    return SwinTransformer(block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2, **kw)


add("swin_v2", "torchvision", "Swin Transformer V2", vision(lambda: _swin_v2(
    patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
    stochastic_depth_prob=0.0, num_classes=CLASSES)))
tv_class("maxvit", "MaxViT", "torchvision.models.maxvit.MaxVit",
         input_size=(64, 64), stem_channels=16, partition_size=4, block_channels=[16, 32],
         block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0)


# ---------------------------------------------------------------- timm

def timm_model(name, family, model, size=64, drop_path=True, **kw):
    """timm.create_model(model) with random weights and no dropout/drop-path
    (drop_path=False for models whose constructor has no drop_path_rate)."""
    rates = dict(drop_rate=0.0, drop_path_rate=0.0) if drop_path else dict(drop_rate=0.0)

    def make():
        import timm
        return timm.create_model(model, pretrained=False, num_classes=CLASSES, **rates, **kw)
    add(name, "timm", family, vision(make, size))


def timm_class(name, family, cls_path, size=32, **kw):
    """A timm model class (module.Class) built with a small config."""
    def make():
        import importlib
        mod, cls = cls_path.rsplit(".", 1)
        return getattr(importlib.import_module(mod), cls)(
            num_classes=CLASSES, drop_rate=0.0, drop_path_rate=0.0, **kw)
    add(name, "timm", family, vision(make, size))


timm_model("timm_resnet18d", "ResNet-D", "resnet18d")
timm_model("timm_convnext_atto", "ConvNeXt", "convnext_atto")
timm_model("timm_mobilenetv3", "MobileNetV3", "mobilenetv3_small_050")
timm_model("timm_mobilenetv4", "MobileNetV4", "mobilenetv4_conv_small")
timm_model("timm_tinynet_e", "EfficientNet (TinyNet)", "tinynet_e")
timm_model("timm_regnetx_002", "RegNetX", "regnetx_002")
timm_model("timm_ghostnet", "GhostNet", "ghostnet_050", drop_path=False)
timm_model("timm_lcnet", "PP-LCNet", "lcnet_050")
timm_model("timm_rexnet", "ReXNet", "rexnet_100")
timm_model("timm_dla34", "DLA", "dla34", drop_path=False)
timm_model("timm_cspresnet50", "CSPNet", "cspresnet50")
timm_model("timm_hgnetv2", "HGNetV2", "hgnetv2_b0")
timm_model("timm_levit", "LeViT", "levit_128s", img_size=64)
timm_model("timm_deit_distilled", "DeiT (distilled)", "deit_tiny_distilled_patch16_224",
           img_size=64)
timm_model("timm_poolformer", "PoolFormer (MetaFormer)", "poolformer_s12")
timm_model("timm_edgenext", "EdgeNeXt", "edgenext_xx_small")
timm_model("timm_mobilevit", "MobileViT", "mobilevit_xxs")
timm_model("timm_fastvit", "FastViT", "fastvit_t8")
timm_model("timm_efficientvit", "EfficientViT (MIT)", "efficientvit_b0", drop_path=False)
timm_model("timm_pvt_v2", "PVT v2", "pvt_v2_b0")
timm_model("timm_coatnet", "CoAtNet", "coatnet_nano_rw_224", img_size=64)
timm_model("timm_inception_next", "InceptionNeXt", "inception_next_atto")
timm_class("timm_vit", "ViT", "timm.models.vision_transformer.VisionTransformer",
           img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
timm_class("timm_swin", "Swin Transformer", "timm.models.swin_transformer.SwinTransformer",
           img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(2, 2),
           num_heads=(2, 2))
timm_class("timm_mixer", "MLP-Mixer", "timm.models.mlp_mixer.MlpMixer",
           img_size=32, patch_size=8, num_blocks=2, embed_dim=32)


def _resmlp(**kw):
    from functools import partial
    from timm.models.mlp_mixer import MlpMixer, ResBlock, Affine
    from timm.layers import Mlp
    return MlpMixer(block_layer=partial(ResBlock, init_values=0.1), norm_layer=Affine,
                    mlp_layer=Mlp, **kw)


add("timm_resmlp", "timm", "ResMLP", vision(lambda: _resmlp(
    num_classes=CLASSES, img_size=32, patch_size=8, num_blocks=2, embed_dim=32,
    mlp_ratio=2, drop_rate=0.0, drop_path_rate=0.0), 32))


# ---------------------------------------------------------------- transformers

VOCAB, SEQ = 99, 8

# Shared tiny sizes in BERT-style naming; other families spell them out.
BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)
DECODER = dict(BERT, use_cache=False)


def no_dropout(config):
    """Zero every dropout-like rate on config so train mode is deterministic."""
    for k, v in list(vars(config).items()):
        if isinstance(v, float) and any(s in k for s in ("dropout", "pdrop", "layerdrop",
                                                         "drop_path")):
            setattr(config, k, 0.0)
    return config


def _ignore(labels):
    """Mark a couple of label positions ignore_index (-100)."""
    labels = labels.clone()
    labels[0, 1] = -100
    labels[1, -2] = -100
    return labels


def hf_task(task, config, pad=False):
    """The input dict (with labels) for a tiny HF model doing task."""
    if task == "image":
        return dict(pixel_values=torch.randn(BATCH, 3, 32, 32),
                    labels=torch.randint(0, CLASSES, (BATCH,)))
    # ids >= 3 keep clear of pad/bos/eos, so padding is only where placed
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if pad:  # last position of row 1 is padding
        mask[1, -1] = 0
        ids[1, -1] = config.pad_token_id
    d = dict(input_ids=ids, attention_mask=mask)
    if task == "cls":
        d["labels"] = torch.randint(0, config.num_labels, (BATCH,))
    elif task == "causal":  # the model shifts labels itself
        d["labels"] = _ignore(ids).masked_fill(mask == 0, -100)
    elif task in ("mlm", "token"):
        hi = VOCAB if task == "mlm" else config.num_labels
        d["labels"] = _ignore(torch.randint(0, hi, (BATCH, SEQ))).masked_fill(mask == 0, -100)
    elif task == "electra":  # replaced-token detection, 0/1 per token
        d["labels"] = torch.randint(0, 2, (BATCH, SEQ))
    elif task == "seq2seq":  # decoder inputs come from shifting labels
        d["labels"] = _ignore(torch.randint(3, VOCAB, (BATCH, SEQ - 2)))
    elif task == "seq2seq_dec":  # explicit decoder_input_ids
        dec = torch.randint(3, VOCAB, (BATCH, SEQ - 2))
        d["decoder_input_ids"] = dec
        d["labels"] = _ignore(torch.roll(dec, -1, 1))
    else:
        raise ValueError(task)
    return d


def hf(name, family, config_cls, model_cls, task, attn="eager", pad=False, **cfg):
    """A transformers model built from a tiny config; it computes its own loss."""
    def build(seed):
        torch.manual_seed(seed)
        import transformers
        config = no_dropout(getattr(transformers, config_cls)(attn_implementation=attn, **cfg))
        model = getattr(transformers, model_cls)(config)
        return Case(model, hf_task(task, config, pad), (), lambda out: out.loss)
    add(name, "transformers", family, build)


hf("hf_bert", "BERT (encoder)", "BertConfig", "BertForSequenceClassification", "cls",
   pad=True, num_labels=3, **BERT)
hf("hf_bert_mlm", "BERT (encoder)", "BertConfig", "BertForMaskedLM", "mlm", attn="sdpa",
   **BERT)
hf("hf_roberta", "RoBERTa", "RobertaConfig", "RobertaForSequenceClassification", "cls",
   pad=True, num_labels=3, **BERT)
hf("hf_xlm_roberta", "XLM-RoBERTa", "XLMRobertaConfig", "XLMRobertaForTokenClassification",
   "token", num_labels=5, **BERT)
hf("hf_distilbert", "DistilBERT", "DistilBertConfig", "DistilBertForSequenceClassification",
   "cls", num_labels=3, vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
   max_position_embeddings=64)
hf("hf_albert", "ALBERT", "AlbertConfig", "AlbertForSequenceClassification", "cls",
   num_labels=3, embedding_size=16, **BERT)
hf("hf_electra", "ELECTRA", "ElectraConfig", "ElectraForPreTraining", "electra",
   embedding_size=16, **BERT)
hf("hf_deberta_v2", "DeBERTa-v2", "DebertaV2Config", "DebertaV2ForSequenceClassification",
   "cls", num_labels=3, relative_attention=True, position_buckets=8, max_relative_positions=-1,
   pos_att_type=["p2c", "c2p"], position_biased_input=False, **BERT)
hf("hf_mobilebert", "MobileBERT", "MobileBertConfig", "MobileBertForSequenceClassification",
   "cls", num_labels=3, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
   num_feedforward_networks=2, **BERT)
hf("hf_gpt2", "GPT-2", "GPT2Config", "GPT2LMHeadModel", "causal", vocab_size=VOCAB,
   n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64, bos_token_id=1,
   eos_token_id=2, use_cache=False)
hf("hf_gpt_neo", "GPT-Neo", "GPTNeoConfig", "GPTNeoForCausalLM", "causal", vocab_size=VOCAB,
   hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position_embeddings=64,
   attention_types=[[["global", "local"], 1]], window_size=4, bos_token_id=1,
   eos_token_id=2, use_cache=False)
hf("hf_opt", "OPT", "OPTConfig", "OPTForCausalLM", "causal", pad=True, vocab_size=VOCAB,
   hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
   max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False)
hf("hf_bloom", "BLOOM (ALiBi)", "BloomConfig", "BloomForCausalLM", "causal", vocab_size=VOCAB,
   hidden_size=32, n_layer=2, n_head=4, use_cache=False)
hf("hf_llama", "Llama (GQA, RMSNorm, RoPE)", "LlamaConfig", "LlamaForCausalLM", "causal",
   attn="sdpa", num_key_value_heads=1, **DECODER)
hf("hf_llama_eager", "Llama (GQA, RMSNorm, RoPE)", "LlamaConfig", "LlamaForCausalLM",
   "causal", num_key_value_heads=2, **DECODER)
hf("hf_mistral", "Mistral (sliding window)", "MistralConfig", "MistralForCausalLM", "causal",
   num_key_value_heads=2, sliding_window=4, **DECODER)
hf("hf_qwen2", "Qwen2", "Qwen2Config", "Qwen2ForCausalLM", "causal", attn="sdpa",
   num_key_value_heads=2, **DECODER)
hf("hf_qwen3", "Qwen3 (q/k norm)", "Qwen3Config", "Qwen3ForCausalLM", "causal",
   num_key_value_heads=2, head_dim=8, **DECODER)
hf("hf_phi", "Phi (partial RoPE, parallel block)", "PhiConfig", "PhiForCausalLM", "causal",
   partial_rotary_factor=0.5, **DECODER)
hf("hf_phi3", "Phi-3", "Phi3Config", "Phi3ForCausalLM", "causal", num_key_value_heads=2,
   pad_token_id=0, eos_token_id=2, **DECODER)
hf("hf_gemma", "Gemma", "GemmaConfig", "GemmaForCausalLM", "causal", num_key_value_heads=1,
   head_dim=8, **DECODER)
hf("hf_t5", "T5 (encoder-decoder)", "T5Config", "T5ForConditionalGeneration", "seq2seq",
   pad=True, vocab_size=VOCAB, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
   num_decoder_layers=2, relative_attention_num_buckets=8, pad_token_id=0,
   decoder_start_token_id=0, use_cache=False)
hf("hf_bart", "BART (encoder-decoder)", "BartConfig", "BartForConditionalGeneration",
   "seq2seq_dec", vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
   decoder_ffn_dim=64, max_position_embeddings=64, use_cache=False)
hf("hf_vit", "ViT", "ViTConfig", "ViTForImageClassification", "image", attn="sdpa",
   image_size=32, patch_size=8, num_labels=CLASSES,
   **{k: v for k, v in BERT.items() if k not in ("vocab_size", "max_position_embeddings")})
hf("hf_convnext", "ConvNeXt", "ConvNextConfig", "ConvNextForImageClassification", "image",
   image_size=32, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=CLASSES)
hf("hf_swin", "Swin Transformer", "SwinConfig", "SwinForImageClassification", "image",
   image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
   num_labels=CLASSES)

assert len({s.name for s in ZOO}) == len(ZOO), "duplicate zoo names"

# Left out:
# - torchvision: larger members of families already here (resnet34/101/152,
#   vgg13/16/19, efficientnet_b1-b7, vit_b_32/l_*, swin_s/b, convnext_small+,
#   bigger regnets, ...) add size, not new structure. vgg11_bn (129M params)
#   and alexnet (57M) are stock: their 4096-wide classifiers dominate.
# - timm efficientformer_l1: its attention bias is built for a 7x7 token grid,
#   so it only runs at 224x224; hrnet: too big for the zoo.
# Every entry is deterministic in train mode (checked: two forward+backward
# passes of one model give the same loss, and no dropout/drop-path is active).


# Models tfuse refuses on purpose, each with the reason (tests/zoo/README.md's table
# gives the message): run.py counts their refusal as expected, not as a failure.
EXPECTED_REFUSALS = {
    "hf_electra": "its pre-training loss keeps the positions attention_mask marks (logits[active_loss]): a tensor "
                  "whose size depends on the data, which a compiled step cannot have",
    "hf_deberta_v2": "torch.export itself cannot trace it (a guard on a data-dependent size in its relative "
                     "position code)",
}

# What scripts/test.sh runs: together they reach every op mapping of
# tfuse.export that a zoo model uses, in a few minutes.
CI_SUBSET = ["resnet18", "mobilenet_v3_small", "squeezenet1_0", "swin", "maxvit", "timm_poolformer", "hf_bert",
             "hf_roberta", "hf_t5", "hf_llama", "hf_bloom"]
