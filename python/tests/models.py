"""Small models the Python tests export, plan and train: a CNN and a GPT written the way
users write them (attention modules with a head count, separate q/k/v projections)."""

import torch
from torch import nn


class Cnn(nn.Module):
    """Two convolutions and a classifier (no BatchNorm: its statistics are per rank)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class Mlp(nn.Module):
    """Three products sharing one ReLU module (called twice, as users write it)."""

    def __init__(self, d: int = 16, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4 * d, 4 * d)
        self.fc3 = nn.Linear(4 * d, classes)

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        # Read by forward, so that ralpc.torch can make it compute a share of the heads.
        self.n_heads = heads
        self.head_dim = d // heads

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / self.head_dim**0.5)
        mask = torch.tril(torch.ones(t, t, device=x.device)).view(1, 1, t, t)
        att = att.masked_fill(mask == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab: int = 96, ctx: int = 16, d: int = 32, layers: int = 4, heads: int = 4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def cnn_batch(step: int, batch: int = 8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 10, (batch,), generator=g)


def mlp_batch(step: int, batch: int = 8):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(batch, 16, generator=g), torch.randint(0, 10, (batch,), generator=g)


def gpt_batch(step: int, batch: int = 8, seq: int = 16, vocab: int = 96):
    g = torch.Generator().manual_seed(200 + step)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def cnn_loss(out, target):
    return nn.functional.cross_entropy(out, target)


def gpt_loss(out, target):
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def export(model: nn.Module, example, path: str, input_name: str) -> None:
    """``torch.onnx.export`` (the dynamo exporter), which records each node's module."""
    torch.onnx.export(model, (example,), path, dynamo=True, input_names=[input_name])
