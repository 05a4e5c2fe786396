"""Registers, spills and shared memory of every step of the Hopper ladder, compiled for sm_90
ahead of time on a machine with no GPU (as `measurements.kernel_resources_aot` does for the
course kernels): a step whose kernels do not compile here fails on the GPU too.

    python -m measurements.hopper_ladder_aot            (the Triton of this environment)

Step 0 is the course kernel (flash_triton.py) at its H200 defaults; steps 1-5 are
flash_hopper.py's switches and every candidate tile of the step (flash_hopper.LADDER).
bf16, B·H and N left to the runtime (i32 with divisibility-16 hints), unit strides as constants.
STACK is the per-thread local memory spilled registers go to: 0 means no spills.
"""

import sys
from pathlib import Path

from measurements.kernel_resources_aot import TARGET, compile_for_sm90, load, resources, triton

ROOT = Path(__file__).resolve().parents[1]


def compile_hopper(fn, constexprs: dict, descriptors: dict, num_warps: int, num_stages: int):
    """Like `compile_for_sm90`, with the tensor-descriptor arguments typed as the launcher
    builds them (rank 4, one head's BLOCK rows: tensordesc<bf16[1,1,BLOCK,D]>), or None."""
    from triton.compiler import ASTSource
    names = fn.arg_names
    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            consts[name], signature[name] = constexprs[name], "constexpr"
        elif name.startswith("desc_"):
            rows = descriptors.get(name)
            if rows is None:
                consts[name], signature[name] = None, "constexpr"
            else:
                signature[name] = f"tensordesc<bf16[1,1,{rows},{constexprs['HEAD_DIM']}]>"
        elif name.isupper() and name != "H":
            signature[name] = "*fp32" if name in ("L", "DELTA") else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in ("qk_scale", "sm_scale") else "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in consts.items()},
                       attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})


def rows(step, kernels) -> list[tuple]:
    """(D, causal, kernel, tiles, resources or the error) for every candidate of one step."""
    out = []
    for d in (64, 128):
        for causal in (False, True):
            for kernel, fn in (("forward", kernels.hopper_forward_kernel), ("dkdv", kernels.hopper_dkdv_kernel),
                               ("dq", kernels.hopper_dq_kernel)):
                for t in step.tiles[kernel][d]:
                    m, n = t.block_m, t.block_n
                    block_rows = {"forward": dict(desc_q=m, desc_o=m, desc_k=n, desc_v=n),
                                  "dkdv": dict(desc_q=m, desc_do=m, desc_k=n, desc_v=n, desc_dk=n, desc_dv=n),
                                  "dq": dict(desc_q=m, desc_do=m, desc_dq=m, desc_k=n, desc_v=n)}[kernel]
                    constexprs = dict(IS_CAUSAL=causal, HEAD_DIM=d, BLOCK_M=m, BLOCK_N=n, **step.flags())
                    try:
                        compiled = compile_hopper(fn, constexprs, block_rows if step.use_tma else {},
                                                  t.num_warps, t.num_stages)
                        result = resources(compiled)
                    except Exception as exc:   # a failed step is recorded, not hidden
                        result = f"FAILED {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:160]}"
                    out.append((d, causal, kernel, t, result))
    return out


def course_rows(path) -> list[tuple]:
    """Step 0: the course kernels at their H200 defaults (autotune._HOPPER's first entries)."""
    kernels = load(str(path))
    flags = dict(HAS_MASK=False, MASK_IS_BOOL=False, DROPOUT=False, EVEN_D=True, INPUT_PRECISION="ieee")
    out = []
    for d in (64, 128):
        for causal in (False, True):
            fwd_warps = 8 if d == 128 else 4
            for kernel, fn, extra, (m, n, w, s) in (
                    ("forward", kernels.flash_forward_kernel, {}, (128, 64, fwd_warps, 3)),
                    ("dkdv", kernels.flash_backward_dkdv_kernel, {"FAST_PATH": True}, (64, 64, 4, 2)),
                    ("dq", kernels.flash_backward_dq_kernel, {}, (64, 64, 4, 2))):
                constexprs = dict(flags, IS_CAUSAL=causal, BLOCK_M=m, BLOCK_N=n, BLOCK_D=d, **extra)
                out.append((d, causal, kernel, f"{m}x{n} w{w} s{s}", resources(compile_for_sm90(fn, constexprs, w, s))))
    return out


def show(name, results):
    print(f"\n{name}", flush=True)
    for d, causal, kernel, tiles, r in results:
        head = f"  D={d:<4} {'causal' if causal else 'full':7} {kernel:8} {str(tiles):16}"
        if isinstance(r, str):
            print(f"{head} {r}", flush=True)
        else:
            print(f"{head} registers {r['registers']:>3}  spill stack {r['spill_stack_bytes']:>4} B  "
                  f"shared {r['shared_bytes'] // 1024:>3} KiB", flush=True)


def load_hopper():
    """flash_hopper.py as a module of its own (not through flashlab's __init__, which needs torch)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("flash_hopper_aot", ROOT / "flashlab" / "flash_hopper.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main():
    kernels = load_hopper()
    print(f"Triton {triton.__version__}, compiled for sm_90 ({TARGET}); bf16, no mask, no dropout")
    show("step 0 today (flash_triton.py, the H200 defaults)", course_rows(ROOT / "flashlab" / "flash_triton.py"))
    for step in kernels.LADDER:
        show(f"step {step.name}: {step.change}", rows(step, kernels))


if __name__ == "__main__":
    main()
