"""Registers and spills of flashlab's kernels compiled for an H100/H200 (sm_90) on a machine
with no GPU: Triton compiles ahead of time to a cubin, and cuobjdump (shipped in Triton's
wheel) reports its resources. STACK is the per-thread local memory that spilled registers
go to (bytes); 0 means no spills.

The runtime's specialization for the benchmark's shapes is mimicked: unit strides and
GROUP = 1 become constants; pointers and the other integers get divisibility-16 hints.
Under these assumptions the forward's numbers match what the H200 reported for Triton 3.6
(results/h200/kernel_resources.json: D=128 forward 184 registers, 0 spills, 128 KiB
shared). The Triton here may be newer than the GPU's, so compare variants with each other,
not with the GPU.

    python -m measurements.kernel_resources_aot [FLASH_TRITON_PY ...]   (default: flashlab/kernels/dense.py)

Give older versions of the file (``git show REV:flashlab/kernels/dense.py > old.py``) to see
what a change did to register pressure.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)   # compile, don't interpret (flashlab's import would set it)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FLOATS = ("qk_scale", "sm_scale", "dropout_p")
FP32_POINTERS = ("L", "DELTA")


def load(path):
    spec = importlib.util.spec_from_file_location(f"flash_triton_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_for_sm90(fn, constexprs: dict, num_warps: int, num_stages: int):
    names = fn.arg_names
    consts = {k: v for k, v in constexprs.items() if k in names}   # older files lack some flags
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in consts:
            signature[name] = "constexpr"
        elif (len(name) in (3, 4) and name.startswith("s") and name.endswith("d")) or name == "GROUP":
            consts[name], signature[name] = 1, "constexpr"                   # unit stride, GQA group 1
        elif name.isupper() and name not in ("H", "H_KV"):
            signature[name] = "*u8" if name == "MASK" else "*fp32" if name in FP32_POINTERS else "*bf16"
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
        if signature[name].startswith("*") or (signature[name] == "i32" and name != "seed"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs={(names.index(k),): v for k, v in consts.items()},
                       attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})


def resources(kernel) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        report = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(item.split(":", 1) for item in next(line for line in report.splitlines() if "REG:" in line).split())
    return {"registers": int(fields["REG"]), "spill_stack_bytes": int(fields["STACK"]),
            "shared_bytes": kernel.metadata.shared}


def main(paths):
    print(f"Triton {triton.__version__}, compiled for sm_90; bf16, no mask, no dropout, EVEN_D")
    flags = dict(HAS_MASK=False, MASK_IS_BOOL=False, MASK_ROW_SHARED=False, DROPOUT=False, HAS_WINDOW=False,
                 EVEN_D=True, INPUT_PRECISION="ieee")
    for path in paths:
        kernels = load(path)
        print(f"\n{path}")
        for d in (64, 128):
            for causal in (False, True):
                forward = dict(flags, IS_CAUSAL=causal, BLOCK_M=128, BLOCK_N=64, BLOCK_D=d)
                dkdv = dict(flags, IS_CAUSAL=causal, BLOCK_M=64, BLOCK_N=64, BLOCK_D=d)
                variants = [("forward 128x64", kernels.flash_forward_kernel, forward, 8 if d == 128 else 4, 3)]
                if "FAST_PATH" in kernels.flash_backward_dkdv_kernel.arg_names:
                    variants += [("dK/dV 64x64, fast path", kernels.flash_backward_dkdv_kernel,
                                  dict(dkdv, FAST_PATH=True), 4, 2),
                                 ("dK/dV 64x64, all checked", kernels.flash_backward_dkdv_kernel,
                                  dict(dkdv, FAST_PATH=False), 4, 2)]
                else:
                    variants += [("dK/dV 64x64", kernels.flash_backward_dkdv_kernel, dkdv, 4, 2)]
                variants += [("dQ 64x64", kernels.flash_backward_dq_kernel, dkdv, 4, 2)]
                for name, fn, constexprs, warps, stages in variants:
                    r = resources(compile_for_sm90(fn, constexprs, warps, stages))
                    print(f"  D={d:<4} {'causal' if causal else 'full':7} {name:26} w{warps} s{stages}  "
                          f"registers {r['registers']:>3}  spill stack {r['spill_stack_bytes']:>4} B  "
                          f"shared {r['shared_bytes'] // 1024:>3} KiB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or [str(Path(__file__).resolve().parents[1] / "flashlab" / "flash_triton.py")])
