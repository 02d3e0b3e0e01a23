"""Records MLX's layers (mlx 0.32.4, CPU) into layers.safetensors, which nuvec-nn's tests read:
python3 make_layers.py, with mlx installed."""
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

mx.random.seed(2)
out = {}
x = mx.random.normal((3, 5, 8))
out["x"] = x
lin = nn.Linear(8, 6)
out["linear.weight"], out["linear.bias"] = lin.weight, lin.bias
out["linear.y"] = lin(x)
emb = nn.Embedding(10, 4)
ids = mx.array([[1, 9, 0], [3, 3, 7]])
out["embedding.weight"], out["embedding.ids"] = emb.weight, ids
out["embedding.y"] = emb(ids)
out["embedding.linear"] = emb.as_linear(mx.random.normal((2, 4)))
out["embedding.linear_x"] = mx.random.normal((2, 4))
out["embedding.linear"] = emb.as_linear(out["embedding.linear_x"])
rms = nn.RMSNorm(8, eps=1e-5)
rms.weight = mx.random.uniform(shape=(8,))
out["rms.weight"], out["rms.y"] = rms.weight, rms(x)
ln = nn.LayerNorm(8, eps=1e-5)
ln.weight, ln.bias = mx.random.uniform(shape=(8,)), mx.random.normal((8,))
out["ln.weight"], out["ln.bias"], out["ln.y"] = ln.weight, ln.bias, ln(x)
out["ln_plain.y"] = nn.LayerNorm(8, affine=False)(x)
rope = nn.RoPE(8)
q = mx.random.normal((1, 2, 5, 8))
out["rope.x"], out["rope.y"], out["rope.y3"] = q, rope(q), rope(q, offset=3)
# An MLP's loss and gradients, by dotted name.
mlp = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 2, bias=False))
for k, v in tree_flatten(mlp.parameters()):
    out[f"mlp.param.{k}"] = v
mx_in, target = mx.random.normal((4, 8)), mx.random.normal((4, 2))
out["mlp.x"], out["mlp.t"] = mx_in, target
def loss(model, a, b):
    return nn.losses.mse_loss(nn.gelu(model.layers[0](a)) @ model.layers[1].weight.T, b)
value, grads = nn.value_and_grad(mlp, loss)(mlp, mx_in, target)
out["mlp.loss"] = value
for k, v in tree_flatten(grads):
    out[f"mlp.grad.{k}"] = v
mx.eval(out)
mx.save_safetensors("layers.safetensors", out)
print(sorted(k for k in out if k.startswith("mlp.grad")))
