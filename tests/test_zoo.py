"""A zoo of small real models trains on the lazy device unchanged and matches PyTorch eager.

MLP, CNN with BatchNorm (train and eval), a ResNet-style net, LSTM, GRU and a GPT-style
block, with SGD, Adam and AdamW (foreach on and off), gradient clipping, LR schedulers,
gradient accumulation and bfloat16 autocast. Each run does 5 steps with one sync per step:
the losses match eager within 1e-4 relative (2e-2 under autocast), and once warm (after
the first steps, which create optimizer state) a step compiles nothing new, even though the
scheduler changes the learning rate every step.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyxla
from lazyhelp import cnt
import lazyxla.debug.metrics as met

DEV = lazyxla.device()

pytestmark = pytest.mark.usefixtures("nothing_pending")
STEPS = 5
WARM = 2  # steps after which nothing compiles any more


# ---------------------------------------------------------------------------------------
# Models.
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 5))

    def forward(self, x):
        return self.net(x)


class CNNBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU())
        self.layers = nn.Sequential(Block(6, 6, 1), Block(6, 8, 2))
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class RNNNet(nn.Module):
    def __init__(self, cell):
        super().__init__()
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(6, 10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 5)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)  # a key bias gets only round-off gradients
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.drop(self.proj(y))


class GPT(nn.Module):
    def __init__(self, vocab=17, d=16, heads=2, ctx=8, tie=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.0))
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.lnf(x))


# ---------------------------------------------------------------------------------------
# Data: (input, target) micro-batches per step, made on the CPU from a fixed generator.
def batch(kind, step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    n = 8
    if kind == "mlp":
        return torch.randn(n, 12, generator=g), torch.randint(0, 5, (n,), generator=g)
    if kind in ("cnn", "cnn_eval"):
        return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)
    if kind == "resnet":
        return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)
    if kind in ("lstm", "gru"):
        return torch.randn(n, 5, 6, generator=g), torch.randint(0, 5, (n,), generator=g)
    if kind == "gpt":
        seq = torch.randint(0, 17, (4, 9), generator=g)
        return seq[:, :-1], seq[:, 1:]
    raise KeyError(kind)


MODELS = {"mlp": MLP, "cnn": CNNBN, "resnet": ResNet, "lstm": lambda: RNNNet("lstm"),
          "gru": lambda: RNNNet("gru"), "gpt": GPT}


def loss_of(kind, out, y):
    if kind == "gpt":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


OPTS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-nesterov-wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam-loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, foreach=True),
    "adamw-loop": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, foreach=False),
}

SCHEDS = {
    None: None,
    "step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=STEPS + 1),
}


def train(model, kind, opt, device, clip=None, sched=None, accum=1, amp=False):
    """STEPS optimizer steps; returns the losses and the UncachedCompile count after each sync."""
    o = OPTS[opt](model.parameters())
    s = SCHEDS[sched](o) if sched else None
    model.train()
    losses, compiles = [], []
    amp_dev = "lazyxla" if device == DEV else "cpu"
    for step in range(STEPS):
        o.zero_grad()
        total = 0.0
        for micro in range(accum):
            x, y = (t.to(device) for t in batch(kind, step, micro))
            with torch.autocast(amp_dev, dtype=torch.bfloat16, enabled=amp):
                out = model(x)
                loss = loss_of(kind, out, y) / accum
            loss.backward()
            total = total + loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        o.step()
        if s is not None:
            s.step()
        if device == DEV:
            lazyxla.sync()
            compiles.append(cnt("UncachedCompile"))
        losses.append(float(total.float().item()))
    return losses, compiles


def compare(kind, opt, clip=None, sched=None, accum=1, amp=False, rtol=1e-4, atol=1e-6, seed=0):
    torch.manual_seed(seed)
    ref = MODELS[kind]()
    lz = copy.deepcopy(ref).to(DEV)
    want, _ = train(ref, kind, opt, "cpu", clip, sched, accum, amp)
    got, compiles = train(lz, kind, opt, DEV, clip, sched, accum, amp)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=rtol, atol=atol)
    # once warm, a step compiles nothing: not for a new LR, a new momentum, a new bias correction
    assert compiles[-1] == compiles[WARM - 1], compiles
    if not amp:
        for (name, p_ref), p_lz in zip(ref.named_parameters(), lz.parameters()):
            torch.testing.assert_close(p_lz.detach().cpu(), p_ref.detach(), rtol=1e-3, atol=1e-4, msg=name)
        for (name, b_ref), b_lz in zip(ref.named_buffers(), lz.buffers()):
            torch.testing.assert_close(b_lz.cpu(), b_ref, rtol=1e-3, atol=1e-4, msg=name)
    return ref, lz


CASES = [
    # kind, optimizer, clip, scheduler, micro-batches per step
    ("mlp", "sgd", 0.5, "step", 1),
    ("mlp", "adam-foreach", None, None, 2),
    ("mlp", "adam-loop", 1.0, "onecycle", 1),
    ("cnn", "adamw-foreach", None, "step", 1),
    ("cnn", "sgd-nesterov-wd", None, None, 2),
    ("resnet", "sgd", 1.0, "onecycle", 1),
    ("lstm", "adam-foreach", 0.5, None, 1),
    ("gru", "sgd", None, "step", 1),
    ("gpt", "adamw-foreach", 1.0, "onecycle", 1),
    ("gpt", "adamw-loop", None, "step", 2),
]


@pytest.mark.parametrize("kind,opt,clip,sched,accum", CASES,
                         ids=[f"{k}-{o}-clip{c}-{s}-acc{a}" for k, o, c, s, a in CASES])
def test_trains_like_eager(kind, opt, clip, sched, accum):
    compare(kind, opt, clip, sched, accum)


def test_batchnorm_eval_after_training_matches_and_does_not_update_stats():
    ref, lz = compare("cnn", "adam-foreach")
    ref.eval()
    lz.eval()
    x, _ = batch("cnn", 99)
    stats = [b.cpu().clone() for b in lz.buffers()]
    compiles = []
    for _ in range(3):
        with torch.no_grad():
            got = lz(x.to(DEV))
        lazyxla.sync()
        compiles.append(cnt("UncachedCompile"))
    with torch.no_grad():
        want = ref(x)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    for before, after in zip(stats, lz.buffers()):
        torch.testing.assert_close(after.cpu(), before, rtol=0, atol=0)
    assert compiles[-1] == compiles[0], compiles
    # back to train mode: the running statistics move again
    lz.train()
    lz(x.to(DEV))
    lazyxla.sync()
    assert not torch.equal(next(m for m in lz.modules() if isinstance(m, nn.BatchNorm2d)).running_mean.cpu(),
                           stats[0])


def test_batchnorm_counts_batches_in_int64():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    lbn = copy.deepcopy(bn).to(DEV)
    for i in range(3):
        x = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(i))
        bn(x)
        lbn(x.to(DEV))
        lazyxla.sync()
    assert lbn.num_batches_tracked.dtype == torch.int64 and lbn.num_batches_tracked.item() == 3
    torch.testing.assert_close(lbn.running_var.cpu(), bn.running_var)


@pytest.mark.parametrize("kind,opt", [("mlp", "sgd"), ("cnn", "adamw-foreach"), ("gpt", "adam-foreach")])
def test_autocast_bfloat16_trains_like_eager_autocast(kind, opt):
    compare(kind, opt, amp=True, rtol=2e-2, atol=2e-2)


def test_autocast_runs_matmul_in_bfloat16_and_softmax_in_float32():
    a = torch.randn(4, 8).to(DEV)
    w = torch.randn(8, 3).to(DEV)
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        y = a @ w
        s = torch.softmax(y, dim=-1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = a.cpu() @ w.cpu()
    torch.testing.assert_close(y.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)


def test_module_to_device_keeps_tied_weights():
    """``model.to(device)`` keeps a parameter shared by two modules shared (as PyTorch does
    for CUDA; torch_xla does not), so a weight-tied language model trains the same on the lazy
    device, and nothing warns."""
    torch.manual_seed(0)
    ref = GPT(tie=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lz = copy.deepcopy(ref).to(DEV)
    tied = lz.head.weight is lz.tok.weight
    assert tied, "model.to(lazyxla) turned one shared Parameter into two independent ones"
    assert len(list(lz.parameters())) == len(list(ref.parameters()))
    want, _ = train(ref, "gpt", "adamw-loop", "cpu")
    got, compiles = train(lz, "gpt", "adamw-loop", DEV)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    assert compiles[-1] == compiles[WARM - 1], compiles
    assert lz.head.weight is lz.tok.weight
    torch.testing.assert_close(lz.tok.weight.detach().cpu(), ref.tok.weight.detach(), rtol=1e-3, atol=1e-4)


def _scaler_run(device, bad_steps):
    """SGD through torch.amp.GradScaler (growth every 2 clean steps); an inf input makes an
    inf gradient on the steps marked bad. Returns (weights, scale) after each step."""
    torch.manual_seed(0)
    m = nn.Linear(2, 1).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu" if device == "cpu" else "lazyxla", init_scale=2.0 ** 16, growth_interval=2)
    seen = []
    for bad in bad_steps:
        opt.zero_grad()
        x = torch.tensor([[float("inf") if bad else 1.0, 2.0]]).to(device)
        scaler.scale(m(x).sum()).backward()
        scaler.step(opt)
        scaler.update()
        if device == DEV:
            lazyxla.sync()
        seen.append((m.weight.detach().cpu().clone(), scaler.get_scale()))
    return seen


def test_grad_scaler_skips_inf_steps_and_moves_the_scale_like_eager():
    bad = [False, True, False, False, False, True, False]
    want, got = _scaler_run("cpu", bad), _scaler_run(DEV, bad)
    assert [s for _, s in got] == [s for _, s in want] == [65536.0, 32768.0, 32768.0, 65536.0, 65536.0, 32768.0,
                                                           32768.0]
    for (w_got, _), (w_want, _) in zip(got, want):
        torch.testing.assert_close(w_got, w_want, rtol=1e-6, atol=1e-7)


def test_moving_a_model_keeps_every_tie_and_nothing_else_shared():
    """Only parameters that were one object before the move are one after it; a model moved
    again keeps its tie."""
    torch.manual_seed(0)
    ref = GPT(tie=True)
    lz = copy.deepcopy(ref).to(DEV)
    ids = {id(p) for p in lz.parameters()}
    assert len(ids) == len({id(p) for p in ref.parameters()})
    assert lz.to(DEV).head.weight is lz.tok.weight  # already there: nothing to move, the tie stays
    untied = copy.deepcopy(GPT()).to(DEV)
    assert untied.head.weight is not untied.tok.weight


def test_gpt_generation_loop_with_growing_context_is_correct():
    """Inference with a different sequence length each step: correct values (one graph per length)."""
    torch.manual_seed(3)
    ref = GPT().eval()
    lz = copy.deepcopy(ref).to(DEV)
    seq = torch.tensor([[1, 2, 3]])
    lseq = seq.to(DEV)
    with torch.no_grad():
        for _ in range(3):
            nxt = ref(seq)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            lnxt = lz(lseq)[:, -1].argmax(-1, keepdim=True)
            lseq = torch.cat([lseq, lnxt], 1)
            lazyxla.sync()
    assert lseq.cpu().tolist() == seq.tolist()


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01, fused=True),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, maximize=True, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=1e-1, momentum=0.9, nesterov=True, weight_decay=0.1, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=1e-1, momentum=0.5, dampening=0.2, maximize=True, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=1e-1, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1), momentum=0.9, fused=True),  # a CPU tensor lr
], ids=["adamw", "adam-amsgrad", "adamw-maximize", "sgd-nesterov", "sgd-dampening-maximize", "sgd-plain",
        "sgd-tensor-lr"])
def test_fused_optimizers_step_on_the_device_like_eager_and_a_scheduled_lr_does_not_recompile(make):
    """fused=True (transformers' default optimizer is fused AdamW): one node per step for
    every parameter, no CPU fallback, eager's numbers; the learning rate a scheduler changes
    every step is an operand, not a constant of the program."""
    torch.manual_seed(0)
    ref = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(7))]
    lz = [nn.Parameter(p.detach().clone().to(DEV)) for p in ref]
    o_ref, o_lz = make(ref), make(lz)
    s_ref = torch.optim.lr_scheduler.StepLR(o_ref, 1, 0.7)
    s_lz = torch.optim.lr_scheduler.StepLR(o_lz, 1, 0.7)
    compiles = []
    for _ in range(6):
        for a, b in zip(ref, lz):
            g = torch.randn(a.shape)
            a.grad, b.grad = g.clone(), g.clone().to(DEV)
        o_ref.step(), o_lz.step(), s_ref.step(), s_lz.step()
        lazyxla.sync()
        compiles.append(cnt("UncachedCompile"))
    for a, b in zip(ref, lz):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    assert not [n for n in met.counter_names() if n.startswith("aten::_fused")]
    assert compiles[2:] == [compiles[2]] * 4, compiles


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True),
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
], ids=["adamw", "sgd-momentum"])
def test_fused_optimizers_under_a_grad_scaler_skip_the_inf_step_like_eager(make):
    def run(device):
        torch.manual_seed(0)
        m = nn.Linear(3, 1).to(device)
        opt = make(m.parameters())
        scaler = torch.amp.GradScaler("cpu" if device == "cpu" else "lazyxla", init_scale=2.0 ** 8)
        seen = []
        for bad in (False, True, False):
            opt.zero_grad()
            x = torch.tensor([[float("inf") if bad else 1.0, 2.0, 3.0]]).to(device)
            scaler.scale(m(x).sum()).backward()
            scaler.step(opt)
            scaler.update()
            if device == DEV:
                lazyxla.sync()
            seen.append((m.weight.detach().cpu().clone(), scaler.get_scale()))
        return seen
    want, got = run("cpu"), run(DEV)
    assert [s for _, s in got] == [s for _, s in want] == [256.0, 128.0, 128.0]
    assert torch.equal(got[1][0], got[0][0])  # the inf step changed nothing
    for (w_got, _), (w_want, _) in zip(got, want):
        torch.testing.assert_close(w_got, w_want, rtol=1e-5, atol=1e-6)
