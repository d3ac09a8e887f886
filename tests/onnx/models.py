"""models.py — small ONNX models for tests/onnx/test_onnx.py and the fuzz
target's seed corpus (tests/fuzz/corpus/onnx), built with onnx.helper: each
exercises a group of the ops runtime/onnx_import.c reads, at a stated
opset, with inputs drawn fresh by the test.

    python tests/onnx/models.py OUTDIR     # writes OUTDIR/NAME.onnx for each
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def model(name, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="tfuse tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def all_models():
    n = helper.make_node
    ms = {}
    # pointwise: unary, binary with broadcasting, variadic, activations with attributes
    ms["pointwise"] = model("pointwise", [
        n("Add", ["x", "y"], ["a"]), n("Mul", ["a", "c"], ["b"]), n("Sub", ["b", "y"], ["d"]), n("Div", ["d", "two"], ["e"]),
        n("Tanh", ["e"], ["t"]), n("Sigmoid", ["t"], ["s"]), n("Exp", ["s"], ["ex"]), n("Log", ["ex"], ["lg"]), n("Abs", ["lg"], ["ab"]),
        n("Sqrt", ["ab"], ["sq"]), n("Neg", ["sq"], ["ng"]), n("Relu", ["e"], ["r"]), n("LeakyRelu", ["e"], ["lr"], alpha=0.2),
        n("Elu", ["e"], ["el"], alpha=0.7), n("Selu", ["e"], ["se"]), n("HardSigmoid", ["e"], ["hs"]), n("HardSwish", ["e"], ["hw"]),
        n("Softsign", ["e"], ["ss"]), n("Softplus", ["e"], ["sp"]), n("Erf", ["e"], ["er"]), n("Sin", ["e"], ["si"]), n("Cos", ["e"], ["co"]),
        n("Reciprocal", ["two"], ["rc"]), n("Pow", ["ab", "rc"], ["pw"]),
        n("Max", ["ng", "r", "lr"], ["mx"]), n("Min", ["el", "se"], ["mn"]), n("Sum", ["hs", "hw", "ss"], ["sm"]), n("Mean", ["sp", "er"], ["me"]),
        n("Clip", ["si", "lo", "hi"], ["cl"]), n("Add", ["mx", "mn"], ["o1"]), n("Add", ["sm", "me"], ["o2"]), n("Add", ["cl", "co"], ["o3"]),
        n("Add", ["o1", "o2"], ["o4"]), n("Add", ["o4", "o3"], ["o5"]), n("Add", ["o5", "pw"], ["out"]),
    ], [("x", F, [3, 4]), ("y", F, [4])], [("out", F, [3, 4])],
        [init("c", rnd(1, 4, seed=1)), init("two", np.array(2.0, np.float32)), init("lo", np.array(-0.5, np.float32)),
         init("hi", np.array(0.5, np.float32))])
    # comparisons, Where, Cast, Equal on ints
    ms["where_cast"] = model("where_cast", [
        n("Greater", ["x", "y"], ["g"]), n("Less", ["x", "y"], ["l"]), n("GreaterOrEqual", ["x", "zero"], ["ge"]),
        n("LessOrEqual", ["y", "zero"], ["le"]), n("Where", ["g", "x", "y"], ["w"]), n("Cast", ["l"], ["lf"], to=F),
        n("Cast", ["ge"], ["gf"], to=F), n("Cast", ["le"], ["lef"], to=F), n("Add", ["w", "lf"], ["a"]), n("Add", ["a", "gf"], ["b"]),
        n("Add", ["b", "lef"], ["out"]), n("Cast", ["x"], ["xi"], to=I64), n("Equal", ["xi", "izero"], ["eq"]),
    ], [("x", F, [2, 5]), ("y", F, [2, 5])], [("out", F, [2, 5]), ("eq", B, [2, 5])],
        [init("zero", np.array(0.0, np.float32)), init("izero", np.array(0, np.int64))])
    # layout: shapes folded at import (Shape, Gather, Concat, Unsqueeze), Reshape with 0 and -1, Transpose, Slice, Split,
    # Squeeze, Flatten, Expand, ConstantOfShape, Concat of tensors, Identity
    ms["layout"] = model("layout", [
        n("Shape", ["x"], ["shp"]), n("Gather", ["shp", "i0"], ["n0"], axis=0), n("Unsqueeze", ["n0", "ax0"], ["n0u"]),
        n("Concat", ["n0u", "m1"], ["tgt"], axis=0), n("Reshape", ["x", "tgt"], ["flat"]),
        n("Reshape", ["x", "keep"], ["same"]), n("Transpose", ["same"], ["tr"], perm=[0, 2, 1]),
        n("Slice", ["tr", "st", "en", "axs", "sps"], ["sl"]), n("Split", ["flat", "parts"], ["p1", "p2"], axis=1),
        n("Unsqueeze", ["p1", "ax1"], ["p1u"]), n("Squeeze", ["p1u", "ax1"], ["p1s"]), n("Flatten", ["x"], ["fl"], axis=2),
        n("Expand", ["row", "eshape"], ["ex"]), n("ConstantOfShape", ["cshape"], ["cs"], value=helper.make_tensor("v", F, [1], [1.5])),
        n("Concat", ["p1s", "p2"], ["cat"], axis=1), n("Identity", ["cat"], ["id"]), n("Add", ["id", "flat"], ["out"]),
        n("Add", ["ex", "cs"], ["out2"]),
    ], [("x", F, [2, 3, 4])], [("out", F, [2, 12]), ("sl", F, [2, 2, 2]), ("fl", F, [6, 4]), ("out2", F, [3, 4])],
        [init("i0", np.array(0, np.int64)), init("ax0", np.array([0], np.int64)), init("m1", np.array([-1], np.int64)),
         init("keep", np.array([0, 0, -1], np.int64)), init("st", np.array([1, 0], np.int64)), init("en", np.array([3, 2], np.int64)),
         init("axs", np.array([1, 2], np.int64)), init("sps", np.array([1, 1], np.int64)), init("parts", np.array([5, 7], np.int64)),
         init("ax1", np.array([1], np.int64)), init("row", rnd(1, 4, seed=2)), init("eshape", np.array([3, 4], np.int64)),
         init("cshape", np.array([3, 4], np.int64))])
    # opset 11: Softmax's 2-D view (axis 1 of a rank-3 input), Squeeze/Unsqueeze/ReduceSum axes as attributes, Split sizes as one
    ms["opset11"] = model("opset11", [
        n("Softmax", ["x"], ["sm"], axis=1), n("LogSoftmax", ["x"], ["lsm"]), n("ReduceSum", ["x"], ["rs"], axes=[2], keepdims=0),
        n("ReduceMean", ["x"], ["rm"], axes=[1]), n("ReduceMax", ["x"], ["rx"], keepdims=1), n("Unsqueeze", ["rs"], ["u"], axes=[0]),
        n("Squeeze", ["u"], ["sq"], axes=[0]), n("Split", ["x"], ["a", "b"], axis=2, split=[1, 3]), n("Clip", ["b", "lo"], ["cb"]),
    ], [("x", F, [2, 3, 4])], [("sm", F, [2, 3, 4]), ("lsm", F, [2, 3, 4]), ("sq", F, [2, 3]), ("rm", F, [2, 1, 4]),
                               ("rx", F, [1, 1, 1]), ("a", F, [2, 3, 1]), ("cb", F, [2, 3, 3])],
        [init("lo", np.array(-0.2, np.float32))], opset=11)
    # matrix products: MatMul (batched, 1-D), Gemm with transB, alpha, beta and C
    ms["matmul"] = model("matmul", [
        n("MatMul", ["a", "b"], ["ab"]), n("MatMul", ["v", "w"], ["vw"]), n("MatMul", ["w2", "v2"], ["wv"]),
        n("Gemm", ["x", "wt", "c"], ["g"], transB=1, alpha=0.5, beta=2.0), n("Gemm", ["x", "wn"], ["g2"]),
    ], [("a", F, [2, 3, 4]), ("b", F, [4, 5]), ("v", F, [4]), ("w2", F, [3, 4]), ("x", F, [3, 6])],
        [("ab", F, [2, 3, 5]), ("vw", F, [5]), ("wv", F, [3]), ("g", F, [3, 2]), ("g2", F, [3, 2])],
        [init("w", rnd(4, 5, seed=3)), init("v2", rnd(4, seed=4)), init("wt", rnd(2, 6, seed=5)), init("c", rnd(2, seed=6)),
         init("wn", rnd(6, 2, seed=7))])
    # images: Conv (groups, strides, SAME padding, dilation), pools, global pools, BatchNormalization, Flatten
    ms["conv"] = model("conv", [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[1, 1]),
        n("BatchNormalization", ["c1", "g", "bb", "mean", "var"], ["bn"], epsilon=1e-3),
        n("Relu", ["bn"], ["r"]), n("Conv", ["r", "w2"], ["c2"], group=2, auto_pad="SAME_UPPER"),
        n("Conv", ["c2", "w3"], ["c3"], dilations=[2, 2], pads=[2, 2, 2, 2], strides=[2, 2]),
        n("MaxPool", ["c3"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        n("AveragePool", ["c2"], ["ap"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1),
        n("GlobalAveragePool", ["mp"], ["gap"]), n("GlobalMaxPool", ["ap"], ["gmp"]), n("Flatten", ["gap"], ["out"]),
    ], [("x", F, [2, 3, 8, 8])], [("out", F, [2, 4]), ("gmp", F, [2, 4, 1, 1])],
        [init("w1", rnd(4, 3, 3, 3, seed=8)), init("b1", rnd(4, seed=9)), init("g", rnd(4, seed=10) + 2),
         init("bb", rnd(4, seed=11)), init("mean", rnd(4, seed=12)), init("var", np.abs(rnd(4, seed=13)) + 0.5),
         init("w2", rnd(4, 2, 3, 3, seed=14)), init("w3", rnd(4, 4, 3, 3, seed=15))])
    # a transformer's pieces: Gather of embedding rows, LayerNormalization, Gelu (opset 20), a named batch dim
    ms["embed"] = model("embed", [
        n("Gather", ["table", "ids"], ["e"]), n("LayerNormalization", ["e", "ln_g", "ln_b"], ["ln"], epsilon=1e-5),
        n("Gelu", ["ln"], ["ge"]), n("Gelu", ["ln"], ["gt"], approximate="tanh"), n("Add", ["ge", "gt"], ["out"]),
    ], [("ids", I64, ["batch", 5])], [("out", F, ["batch", 5, 8])],
        [init("table", rnd(11, 8, seed=16)), init("ln_g", rnd(8, seed=17)), init("ln_b", rnd(8, seed=18))], opset=20)
    # masks: exporters' mask and index arithmetic on constants (folded at import: Range, Expand, GatherElements,
    # Equal, Where, Mod, Floor, Sign, Not), then logic on the model's own values (And, Or, Xor, Not, IsNaN, IsInf)
    # and a Gather of known indices on axis 1
    i64 = lambda name, a: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(a, np.int64), name))
    f32 = lambda name, a: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(a, np.float32), name))
    ms["masks"] = model("masks", [
        i64("zero", 0), i64("four", 4), i64("one", 1), i64("three", 3), i64("two", 2), i64("perm", [[3, 0, 1, 2], [1, 1, 0, 3]]),
        f32("half", [-1.5, 2.5, 0.5, -0.25]), i64("cols", [3, 0]),
        n("Shape", ["x"], ["shp"]), n("Range", ["zero", "four", "one"], ["r"]), n("Expand", ["r", "shp"], ["er"]),
        n("GatherElements", ["er", "perm"], ["ge"], axis=1), n("Mod", ["ge", "two"], ["md"]), n("Equal", ["md", "zero"], ["even"]),
        n("Less", ["ge", "three"], ["small"]), n("Not", ["small"], ["big"]),
        n("Floor", ["half"], ["fl"]), n("Sign", ["fl"], ["sg"]), n("Where", ["even", "sg", "half"], ["w"]),
        n("Greater", ["x", "w"], ["pos"]), n("And", ["pos", "even"], ["a"]), n("Or", ["pos", "big"], ["o"]),
        n("Xor", ["a", "o"], ["xo"]), n("Not", ["xo"], ["nx"]),
        n("Log", ["x"], ["lx"]), n("IsNaN", ["lx"], ["isnan"]),
        n("Sub", ["x", "x"], ["z"]), n("Div", ["x", "z"], ["q"]), n("IsInf", ["q"], ["pinf"], detect_negative=0),
        n("IsInf", ["q"], ["anyinf"]), n("Gather", ["x", "cols"], ["gx"], axis=1),
    ], [("x", F, [2, 4])], [("nx", B, [2, 4]), ("isnan", B, [2, 4]), ("pinf", B, [2, 4]), ("anyinf", B, [2, 4]), ("gx", F, [2, 2])])
    # newer ops, opset 23: Attention (grouped-query heads, a bool mask, causal; and softcap with the scores as an output),
    # RMSNormalization, LayerNormalization over two axes with its statistics, Pad (reflect, constant), Tile, Gather of
    # computed indices on axis 1, Slice with a negative step, the derived reductions, integer Div, Swish
    ms["newer"] = model("newer", [
        i64("pads", [0, 1, 0, 2]), i64("reps", [1, 2]), i64("st", [-1]), i64("en", [-100]), i64("ax", [1]), i64("stp", [-2]),
        i64("rax", [1]),
        n("Attention", ["q", "k", "v", "mask"], ["att"], is_causal=1),
        n("Attention", ["q", "k", "v"], ["att2", "", "", "scores"], softcap=2.0, qk_matmul_output_mode=3),
        n("RMSNormalization", ["x", "g"], ["rms"], axis=-1, epsilon=1e-4),
        n("LayerNormalization", ["x3", "g2", "b2"], ["ln", "mu", "isd"], axis=1),
        n("Pad", ["x", "pads"], ["prf"], mode="reflect"), n("Pad", ["x", "pads", "cval"], ["pc"]),
        n("Tile", ["x", "reps"], ["tl"]), n("Gather", ["x", "ids"], ["gx"], axis=1),
        n("Slice", ["x", "st", "en", "ax", "stp"], ["sl"]),
        n("ReduceLogSumExp", ["x", "rax"], ["lse"], keepdims=0), n("ReduceL2", ["x", "rax"], ["l2"]),
        n("ReduceMin", ["x", "rax"], ["mn"]), n("Div", ["ids", "two2"], ["idiv"]),
    ], [("q", F, [2, 4, 5, 8]), ("k", F, [2, 2, 6, 8]), ("v", F, [2, 2, 6, 8]), ("mask", B, [5, 6]), ("x", F, [3, 6]),
        ("x3", F, [2, 3, 4]), ("ids", I64, [2, 2])],
        [("att", F, [2, 4, 5, 8]), ("att2", F, [2, 4, 5, 8]), ("scores", F, [2, 4, 5, 6]), ("rms", F, [3, 6]),
         ("ln", F, [2, 3, 4]), ("mu", F, [2, 1, 1]), ("isd", F, [2, 1, 1]), ("prf", F, [3, 9]), ("pc", F, [3, 9]),
         ("tl", F, [3, 12]), ("gx", F, [3, 2, 2]), ("sl", F, [3, 3]), ("lse", F, [3]), ("l2", F, [3, 1]), ("mn", F, [3, 1]),
         ("idiv", I64, [2, 2])],
        [init("g", rnd(6, seed=20)), init("g2", rnd(3, 4, seed=21)), init("b2", rnd(3, 4, seed=22)),
         init("cval", np.array(0.5, np.float32)), init("two2", np.array([[2, -3]], np.int64))], opset=23)
    return ms


if __name__ == "__main__":
    out = sys.argv[1]
    for name, m in all_models().items():
        onnx.save(m, f"{out}/{name}.onnx")
        print(f"{out}/{name}.onnx")
