"""The autotuner's periphery, on CPU with fake kernels: configurations sized to the GPU's
shared memory, the decision as a pure function, the decisions cache (any content, concurrent
writers), the decisions shipped with the package, and the one warning a tuning call gives.
The GPU side (fp32 at D = 96/128/256 compiling, tuning off and on) is at the end."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from flashlab.launch import autotune, autotune_cache
from flashlab.launch.autotune import Config, Trial
from flashlab.reference.float64 import rel_error

ROOT = Path(__file__).parents[2]
CUDA = torch.cuda.is_available()
HOPPER, A100, ADA = 232448, 166912, 101376        # shared memory per block (opt-in), bytes

# Shared memory of compiled kernels as Triton reported it on an H200 (Triton 3.6, bf16;
# results/h200/kernel_resources.json): (kernel, D, BLOCK_M, BLOCK_N, num_stages) → bytes.
MEASURED_BF16 = {
    ("forward", 64, 128, 64, 3): 65536, ("forward", 64, 64, 64, 4): 73728,
    ("forward", 128, 128, 128, 3): 229376, ("forward", 128, 128, 32, 3): 81920,
    ("dkdv", 64, 64, 64, 2): 50176, ("dkdv", 64, 64, 64, 3): 58368, ("dkdv", 64, 128, 128, 1): 98304,
    ("dkdv", 128, 64, 64, 2): 91136, ("dkdv", 128, 128, 128, 2): 197632, ("dkdv", 128, 128, 128, 1): 163840,
    ("dq", 64, 128, 64, 2): 65536, ("dq", 128, 64, 64, 3): 131072, ("dq", 128, 128, 128, 2): 196608,
}


@pytest.mark.parametrize("row", sorted(MEASURED_BF16), ids=str)
def test_shared_memory_estimate_matches_the_compiler(row):
    kernel, d, m, n, s = row
    assert autotune.shared_memory_bytes(kernel, Config(m, n, 4, s), d, 2) == MEASURED_BF16[row]


# the fake tuner's first-time notices (a GPU's name in a fake key, a cache that cannot be written) are what the code
# under test says to a user; test_tuning_warns_once_and_says_how_to_pretune checks the first one, the rest is noise here
pytestmark = [pytest.mark.filterwarnings("ignore:flashlab. tuning the attention kernels:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:flashlab autotune. cannot read the cache:RuntimeWarning")]


def test_shared_memory_estimate_matches_every_recorded_kernel():
    """Every forward/dkdv/dq row the H200 run recorded (the file is data beside the code)."""
    path = ROOT / "results" / "h200" / "kernel_resources.json"
    if not path.exists():
        pytest.skip("needs the repository's results/")
    names = {"flash_forward_kernel": "forward", "flash_backward_dkdv_kernel": "dkdv", "flash_backward_dq_kernel": "dq"}
    rows = [r for r in json.loads(path.read_text())["rows"] if r["kernel"] in names]
    assert len(rows) >= 40
    for r in rows:
        config = Config(r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"])
        assert autotune.shared_memory_bytes(names[r["kernel"]], config, r["D"], 2) == r["shared_bytes"], r


def test_the_fp32_failure_of_the_issue():
    """fp32, D ≥ 96 on an H200 with tuning off: "Required: 262144, Hardware limit: 232448"
    (the forward's default 128x64 s3, sized for 2-byte elements)."""
    default = autotune.candidates("forward", 96, (9, 0))[0]
    assert autotune.shared_memory_bytes("forward", default, 96, 4) == 262144 > HOPPER
    fitted = autotune.candidates("forward", 96, (9, 0), element_size=4)[0]
    assert autotune.shared_memory_bytes("forward", fitted, 96, 4) <= HOPPER
    assert fitted == Config(128, 64, 8, 2), "one pipeline stage fewer is enough"


@pytest.mark.parametrize("capability,limit", [((9, 0), HOPPER), ((8, 0), A100), ((8, 9), ADA)])
@pytest.mark.parametrize("kernel", autotune.KERNELS)
@pytest.mark.parametrize("d", [16, 64, 96, 128, 200, 256])
@pytest.mark.parametrize("element_size", [2, 4])
def test_sized_candidates_fit(capability, limit, kernel, d, element_size):
    configs = autotune.candidates(kernel, d, capability, element_size=element_size)
    assert configs and len(set(configs)) == len(configs)
    for c in configs:
        assert autotune.shared_memory_bytes(kernel, c, d, element_size) <= limit, c
        assert min(c.block_m, c.block_n) >= 16
        if kernel == "dkdv" and c.num_stages > 1:
            assert c.block_m >= c.block_n, "dK/dV is never pipelined with BLOCK_M < BLOCK_N"
    assert autotune.shared_memory_for(capability) == limit


def test_sizing_keeps_what_fits():
    """bf16 on Hopper: the lists as measured, untouched; the default stays first."""
    for kernel in autotune.KERNELS:
        for d in (64, 128, 256):
            listed = autotune.candidates(kernel, d, (9, 0))
            assert autotune.candidates(kernel, d, (9, 0), element_size=2) == listed
            sized = autotune.candidates(kernel, d, (9, 0), element_size=4)
            assert sized[0] == autotune.fit_shared_memory(kernel, listed[:1], d, 4, HOPPER)[0]
    big = Config(128, 128, 8, 3)
    # 3 → 1 stage (262144 → 196608 B), then 128x128 → 128x64 → 64x64 (98304 B ≤ 100000)
    assert autotune.fit_shared_memory("forward", [big], 128, 4, 100_000) == [Config(64, 64, 8, 1)]
    assert autotune.shared_memory_for((8, 7)) == A100 and autotune.shared_memory_for((8, 2)) == ADA
    with pytest.raises(ValueError, match="kernel"):
        autotune.shared_memory_bytes("backward", big, 64, 2)


# -- decide: the pure decision ------------------------------------------------------------------

def test_decide():
    a, b, c, d = "a", "b", "c", "d"
    chosen, log = autotune.decide([a, b, c, d], {a: Trial(3.0, 0.0), b: Trial(1.0, 0.5), c: Trial(2.0, 1e-4),
                                                 d: "OutOfResources: shared memory"}, tolerance=1e-3)
    assert chosen == c
    assert log[a] == 3.0 and log[c] == 2.0 and "disagrees" in log[b] and "OutOfResources" in log[d]
    assert autotune.decide([a, b], {a: (1.0, 0.0), b: (0.975, 0.0)}, 1e-3)[0] == a   # within the margin
    assert autotune.decide([a, b], {a: (1.0, 0.0), b: (0.9, 0.0)}, 1e-3)[0] == b
    assert autotune.decide([a, b], {a: (1.0, 0.0), b: (0.9, float("nan"))}, 1e-3)[0] == a
    assert autotune.decide([a, b], {b: (5.0, 0.0)}, 1e-3) == (b, {a: "failed: not run", b: 5.0})
    with pytest.raises(RuntimeError, match="a: failed: boom; b: disagrees"):
        autotune.decide([a, b], {a: "boom", b: (1.0, 1.0)}, 1e-3)


def test_decide_is_what_exercise_07_teaches():
    """The package's decision and the exercise's reference solution agree on random measurements
    (the exercise's tests hold the rule; this holds the package to it)."""
    import random

    from solutions.ex07_autotuner import decide as taught
    rng = random.Random(3)
    for _ in range(300):
        configs = [f"c{i}" for i in range(rng.randint(1, 5))]
        trials = {c: rng.choice(["OutOfResources", (rng.choice([1.0, 0.97, 0.9, rng.uniform(0.5, 2)]),
                                                     rng.choice([0.0, 1e-3, 2e-3, float("nan")]))])
                  for c in configs if rng.random() < 0.9}
        outcomes = []
        for fn in (taught, autotune.decide):
            try:
                outcomes.append(fn(configs, trials, 1e-3))
            except RuntimeError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]


# -- the tuner on fake kernels ------------------------------------------------------------------

class FakeKernel:
    """launch(config) -> outputs; ``wrong`` configs compute a wrong answer, ``broken`` raise."""

    def __init__(self, ms, wrong=(), broken=()):
        self.ms, self.wrong, self.broken = ms, set(wrong), set(broken)
        self.answer, self.calls = torch.randn(32), []

    def launch(self, config):
        self.calls.append(config)
        if config in self.broken:
            raise RuntimeError("out of resources")
        return (self.answer * (1.5 if config in self.wrong else 1.0),)

    def bench(self, fn):
        fn()
        return self.ms[self.calls[-1]]


A, B, C = Config(64, 64, 4, 2), Config(64, 32, 4, 2), Config(32, 32, 4, 1)
KEY = ("forward", "cuda:0", torch.bfloat16, 64, True, False, False, 1, 1024, 1024, 64)


@pytest.fixture(autouse=True)
def tuning_on(monkeypatch):
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "1")


def _tuner(kernel, path, **kw):
    return autotune.Autotuner(bench=kernel.bench, cache_path=str(path), **kw)


@pytest.mark.parametrize("content", [b"[]", b"null", b"42", b'"text"', b"{not json", b"", b'{"k": 1, "j": [2]}',
                                     b"\x00\xff garbage"])
def test_any_cache_content_means_a_warning_and_tuning(tmp_path, content):
    path = tmp_path / "tune.json"
    path.write_bytes(content)
    kernel = FakeKernel({A: 2.0, B: 1.0, C: 3.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _tuner(kernel, path).choose(KEY, [A, B, C], kernel.launch) == B
    messages = [str(w.message) for w in caught]
    if content:          # an empty file reads as invalid JSON too
        assert any(str(path) in m for m in messages), messages
    stored = json.loads(path.read_text())
    assert isinstance(stored, dict) and list(stored.values()) == [str(B)], "rewritten as an object"
    kernel.calls.clear()
    assert _tuner(kernel, path).choose(KEY, [A, B, C], kernel.launch) == B and kernel.calls == []


def test_cache_entries_for_another_gpu_or_a_dropped_candidate_are_retuned(tmp_path):
    path = tmp_path / "tune.json"
    kernel = FakeKernel({A: 2.0, B: 1.0, C: 0.5})
    _tuner(kernel, path).choose(KEY, [A, B], kernel.launch)
    other_gpu = ("forward", "cuda:1") + KEY[2:]
    data = json.loads(path.read_text())
    path.write_text(json.dumps({k.replace("cuda:0", "cuda:1"): "9x9 w1 s1" for k in data}))
    kernel.calls.clear()
    assert _tuner(kernel, path).choose(other_gpu, [A, C], kernel.launch) == C and kernel.calls


WRITER = """
import sys
sys.path.insert(0, {package!r})
import autotune_cache                       # stdlib only: no torch in the writers
for i in range(200):
    autotune_cache.merge_decisions({path!r}, {{f"writer {{sys.argv[1]}} decision {{i}}": f"config {{i}}"}})
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    """3 processes × 200 decisions, each written as soon as it is made (read-merge-replace
    under the lock): all 600 are in the file."""
    path = tmp_path / "tune.json"
    code = WRITER.format(package=str(ROOT / "flashlab" / "launch"), path=str(path))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)]) for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    stored = json.loads(path.read_text())
    assert len(stored) == 600
    assert stored["writer 2 decision 199"] == "config 199"
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


def test_a_read_only_cache_keeps_decisions_in_memory(tmp_path):
    kernel = FakeKernel({A: 2.0, B: 1.0})
    blocker = tmp_path / "file"
    blocker.write_text("")
    tuner = _tuner(kernel, blocker / "tune.json")         # its directory cannot be made
    assert tuner.choose(KEY, [A, B], kernel.launch) == B
    assert tuner.choose(KEY, [A, B], kernel.launch) == B


def test_tuning_warns_once_and_says_how_to_pretune(tmp_path):
    kernel = FakeKernel({A: 2.0, B: 1.0})
    tuner = _tuner(kernel, tmp_path / "tune.json")
    with pytest.warns(RuntimeWarning, match="python -m flashlab tune") as caught:
        tuner.choose(KEY, [A, B], kernel.launch)
        tuner.choose(KEY[:-1] + (128,), [A, B], kernel.launch)
    assert len([w for w in caught if "tuning the attention kernels" in str(w.message)]) == 1


def test_tuning_off_takes_the_first_config_that_compiles(monkeypatch):
    """FLASHLAB_AUTOTUNE=0: no timing; the default, unless the compiler refuses it."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "0")

    class OutOfResources(Exception):
        pass

    calls = []

    def launch(config):
        calls.append(config)
        if config == A:
            raise OutOfResources("shared memory")
        return ()

    tuner = autotune.Autotuner(bench=lambda fn: 1 / 0, cache_path="")
    assert tuner.choose(KEY, [A, B, C], launch) == B and calls == [A, B]
    assert tuner.choose(KEY, [A, B, C], launch) == B and calls == [A, B], "remembered"

    def wrong(config):
        raise ValueError("a real bug")
    with pytest.raises(ValueError, match="real bug"):
        tuner.choose(KEY[:-1] + (4,), [A, B], wrong)


@pytest.mark.parametrize("tuning", ["1", "0"])
def test_nothing_is_tried_or_timed_inside_a_cuda_graph_capture(monkeypatch, tmp_path, tuning):
    """While a CUDA graph is captured (autotune.capturing) a launch is recorded, not run: the
    tuner launches nothing itself, takes the default and keeps no decision; the next call
    outside the capture tunes as usual."""
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", tuning)
    monkeypatch.setattr(autotune, "capturing", lambda device: True)
    kernel = FakeKernel({A: 2.0, B: 1.0, C: 0.5})
    tuner = _tuner(kernel, tmp_path / "tune.json")
    assert tuner.choose(KEY, [A, B, C], kernel.launch) == A and kernel.calls == []
    monkeypatch.setattr(autotune, "capturing", lambda device: False)
    expected = C if tuning == "1" else A
    assert tuner.choose(KEY, [A, B, C], kernel.launch) == expected and kernel.calls, "tuned (or tried) now"
    kernel.calls.clear()
    monkeypatch.setattr(autotune, "capturing", lambda device: True)
    assert tuner.choose(KEY, [A, B, C], kernel.launch) == expected and kernel.calls == [], "a made decision holds"


def test_capturing_is_false_off_the_gpu():
    assert autotune.capturing(torch.device("cpu")) is False


# -- decisions shipped with the package ---------------------------------------------------------

class FakeCuda:
    type = "cuda"

    def __str__(self):
        return "cuda:0"


@pytest.fixture
def fake_h200(monkeypatch, tmp_path):
    """A CUDA device called "NVIDIA H200" on CPU, with a shipped file in a temporary folder."""
    monkeypatch.setattr(autotune, "_gpu_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(autotune, "shared_memory_limit", lambda device: HOPPER)
    monkeypatch.setattr(autotune_cache, "SHIPPED_DIR", tmp_path / "tuned")
    (tmp_path / "tuned").mkdir()
    key = ("forward", FakeCuda(), torch.bfloat16, 64, True, False, False, 1, 1024, 1024, 64)

    def ship(decisions, gpu="NVIDIA H200", fmt=1):
        (tmp_path / "tuned" / "nvidia-h200.json").write_text(json.dumps({"format": fmt, "gpu": gpu,
                                                                         "decisions": decisions}))
    return key, ship


def test_a_shipped_decision_is_used_after_one_check(fake_h200, tmp_path):
    key, ship = fake_h200
    ship({autotune.shipped_key(key): str(B)})
    kernel = FakeKernel({A: 2.0, B: 1.0, C: 0.5})
    tuner = _tuner(kernel, tmp_path / "tune.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # no "tuning" warning
        assert tuner.choose(key, [A, B, C], kernel.launch) == B
    assert kernel.calls == [B, A], "one run of the shipped config, one of the default to compare"
    assert tuner.report()[-1]["from_cache"] == "shipped"
    kernel.calls.clear()                                   # then kept in the user's cache: no check again
    assert _tuner(kernel, tmp_path / "tune.json").choose(key, [A, B, C], kernel.launch) == B and kernel.calls == []


@pytest.mark.parametrize("case", ["wrong", "not a candidate", "other gpu", "old format", "garbage"])
def test_a_shipped_decision_that_does_not_hold_is_retuned(fake_h200, tmp_path, case):
    key, ship = fake_h200
    name = str(Config(16, 16, 1, 1)) if case == "not a candidate" else str(B)
    ship({autotune.shipped_key(key): name}, gpu="NVIDIA H100" if case == "other gpu" else "NVIDIA H200",
         fmt=0 if case == "old format" else 1)
    if case == "garbage":
        (tmp_path / "tuned" / "nvidia-h200.json").write_text("[1, 2")
    kernel = FakeKernel({A: 2.0, B: 1.0, C: 0.5}, wrong={B} if case == "wrong" else ())
    with pytest.warns(RuntimeWarning):
        chosen = _tuner(kernel, tmp_path / "tune.json").choose(key, [A, B, C], kernel.launch)
    assert chosen == C, "tuned: the fastest correct candidate"


def test_the_shipped_file_is_well_formed():
    """Every decision shipped names a candidate of today's lists at its dtype."""
    files = sorted(autotune_cache.SHIPPED_DIR.glob("*.json"))
    assert files, "the package ships decisions for at least one GPU"
    for path in files:
        data = json.loads(path.read_text())
        assert data["format"] == autotune_cache.FORMAT and path.stem == autotune_cache.gpu_slug(data["gpu"])
        decisions = autotune_cache.read_shipped(data["gpu"])
        assert decisions == data["decisions"] and decisions
        for text, name in decisions.items():
            kernel, dtype, d = text.split(" | ")[:3]
            element = getattr(torch, dtype.removeprefix("torch.")).itemsize
            names = {str(c) for c in autotune.candidates(kernel, int(d), (9, 0), element_size=element)}
            assert name in names, (text, name)


# -- on a GPU: fp32 compiles at every D, tuning off and on ----------------------------------------

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("tune", ["0", "1"])
@pytest.mark.parametrize("d", [96, 128, 256])
def test_fp32_large_head_dims_compile_and_agree_on_gpu(monkeypatch, d, tune):
    from flashlab import attention
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", tune)
    monkeypatch.setattr(autotune.tuner, "cache_path", "")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, d, device="cuda", dtype=torch.float32, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        out = attention(q, k, v, is_causal=causal)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
        ref_grads = torch.autograd.grad(ref.square().sum(), (q64, k64, v64))
        for got, want in zip((out, *grads), (ref, *ref_grads)):
            error = float((got.double() - want).norm() / want.norm())
            assert error < 1e-5, (d, causal, error)        # exact fp32 (torch's default precision)


@gpu
@pytest.mark.parametrize("d", [96, 128, 256])
def test_tf32_large_head_dims_tune_and_agree_on_gpu(monkeypatch, d):
    """With TF32 allowed (torch.set_float32_matmul_precision("high")), fp32 is tuned like bf16:
    every candidate that fits the shared memory at 4 bytes per element compiles and is timed.
    Accuracy: TF32 keeps 10 mantissa bits, and the gradients of a loss like Σ O² subtract
    near-equal terms (dP − rowsum(dO ∘ O)), so a fixed tolerance fails by a hair at D = 256
    (5.1e-3 against 5e-3 on an H200, 2026-12-03). The measure is PyTorch's own attention in TF32
    (the same products, matmuls in TF32) against float64: flashlab's error stays within 3× it."""
    from flashlab import attention
    from flashlab.reference.naive import naive_attention  # PyTorch's matmuls (einsum), softmax in fp32
    monkeypatch.setenv("FLASHLAB_AUTOTUNE", "1")
    monkeypatch.setattr(autotune.tuner, "cache_path", "")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, d, device="cuda", requires_grad=True) for _ in range(3))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        results = {}
        for name, fn in (("flashlab", attention), ("torch tf32", naive_attention)):
            out = fn(q, k, v)
            results[name] = (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))
    finally:
        torch.set_float32_matmul_precision(before)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64)
    want = (ref, *torch.autograd.grad(ref.square().sum(), (q64, k64, v64)))

    def errors(got):
        return [rel_error(g, w) for g, w in zip(got, want)]
    ours, torchs = errors(results["flashlab"]), errors(results["torch tf32"])
    for what, mine, theirs in zip(("out", "dq", "dk", "dv"), ours, torchs):
        assert mine < 1e-2, (d, what, mine)                      # TF32 at all, not garbage
        assert mine <= 3 * theirs + 1e-5, (d, what, mine, theirs)
    assert max(torchs) > 1e-5, "TF32 was not in effect for PyTorch's matmuls"


# -- pre-tuning: the command's and the function's errors on CPU ---------------------------------

def test_pretune_says_what_it_needs(capsys):
    from flashlab import cli
    from flashlab.api import pretune
    with pytest.raises(ValueError, match="device: .*CUDA"):
        pretune.pretune([(1, 2, 64, 16)], device="cpu")
    with pytest.raises(SystemExit) as stop:
        cli.tune_main(["--shape", "1,2,3"])                 # B,H,N,D needed
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err   # one line, no usage block
    assert "--shape: '1,2,3' is not B,H,N,D" in err
    assert cli.parse_shape("8,16,2048,64,4") == (8, 16, 2048, 64, 4)
    key = ["dq", "cuda:0", "torch.float32", 96, True, False, False, 2, 1024, 1024, 32]
    shipped = pretune.ship([{"key": key, "chosen": "64x64 w4 s1"}], "NVIDIA H200")
    assert shipped["decisions"] == {"dq | torch.float32 | 96 | True | False | False | 2 | 1024 | 1024 | 32":
                                    "64x64 w4 s1"}
    assert shipped["format"] == autotune_cache.FORMAT and shipped["gpu"] == "NVIDIA H200"


@pytest.mark.skipif(CUDA, reason="the CPU message")
def test_the_tune_command_refuses_a_cpu(capsys):
    from flashlab.cli import main
    with pytest.raises(SystemExit):
        main(["tune", "--shape", "1,2,64,16"])
    assert "no CUDA GPU" in capsys.readouterr().err
