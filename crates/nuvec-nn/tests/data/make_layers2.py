"""Records more MLX layers (mlx 0.32.4, CPU) into layers2.safetensors, which nuvec-nn's tests
read: python3 make_layers2.py, with mlx installed."""
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

mx.random.seed(3)
out = {}
def put(prefix, module):
    for k, v in tree_flatten(module.parameters()):
        out[f"{prefix}.{k}"] = v

x1 = mx.random.normal((2, 9, 4))
c1 = nn.Conv1d(4, 6, 3, stride=2, padding=1)
put("conv1", c1)
out["conv1.x"], out["conv1.y"] = x1, c1(x1)
x2 = mx.random.normal((2, 7, 6, 4))
c2 = nn.Conv2d(4, 8, (3, 2), stride=(1, 2), padding=(1, 0), groups=2)
put("conv2", c2)
out["conv2.x"], out["conv2.y"] = x2, c2(x2)
lin = nn.Linear(128, 6)
put("qlin", lin)
xq = mx.random.normal((3, 128))
q = nn.QuantizedLinear.from_linear(lin, 64, 4)
out["qlin.x"], out["qlin.y"] = xq, q(xq)
mha = nn.MultiHeadAttention(16, 4, bias=True)
put("mha", mha)
qs, ks = mx.random.normal((2, 5, 16)), mx.random.normal((2, 7, 16))
mask = mx.random.normal((2, 1, 5, 7))
out["mha.q"], out["mha.k"], out["mha.mask"] = qs, ks, mask
out["mha.y"] = mha(qs, ks, ks, mask)
out["mha.self"] = mha(qs, qs, qs)
mx.eval(out)
mx.save_safetensors("layers2.safetensors", out)
print(sorted(out))
