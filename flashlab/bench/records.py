"""The records of measurement suites committed to the repository, ``results/<gpu>/<name>.json``
(the current record of each suite, `flashlab.bench.suites`), so that readers without a GPU see
real numbers, labelled with where and when they were measured; and `environment`, the label
every new record carries.

The recorded files are data of the FlashLab repository, not of the installed package: they
are found in the clone this package was installed from (``pip install -e .``), or in the
folder named by the environment variable FLASHLAB_RESULTS_DIR."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch

from flashlab.launch import switches

RESULTS_DIR = switches.results_dir(Path(__file__).resolve().parents[2] / "results")


def environment() -> dict:
    """GPU name, versions and date: the label every recorded result carries."""
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def _repository() -> Path:
    if not RESULTS_DIR.is_dir():
        raise FileNotFoundError(f"recorded results: {RESULTS_DIR} does not exist; they are data of the FlashLab "
                                "repository, so install flashlab from a clone (pip install -e .) or set "
                                "FLASHLAB_RESULTS_DIR to a clone's results/ folder.")
    return RESULTS_DIR


def load(suite: str, gpu: str = "h200") -> dict | None:
    """The current record of ``suite`` on ``gpu``, ``results/<gpu>/<suite>.json`` (a suite's record
    name, `python -m flashlab.bench list`), or None if none was recorded there. Raises
    FileNotFoundError, in one line, when there is no repository to read from."""
    path = _repository() / gpu / f"{suite}.json"
    return json.loads(path.read_text()) if path.exists() else None


def folder(name: str, gpu: str = "h200") -> Path:
    """``results/<gpu>/<name>/``: the files a record keeps beside it (a training run's metrics and
    tours). Raises FileNotFoundError, in one line, when the repository or the folder is missing."""
    path = _repository() / gpu / name
    if not path.is_dir():
        raise FileNotFoundError(f"recorded results: {path} does not exist; restore it with git checkout results/")
    return path


def measured_on(recorded: dict) -> str:
    """The GPU (or CPU) and versions a recorded result was measured with, without its date: what a
    lesson shows beside a record (the record keeps the date, git its history)."""
    env = recorded["environment"]
    return ", ".join([env["gpu"], f"PyTorch {env['torch']}"] + ([f"Triton {env['triton']}"] if "triton" in env else []))


# The H200's datasheet (dense, no sparsity): what stands in for a peak no run has recorded yet
H200_DATASHEET = {"bf16_matmul_flops": 989e12, "hbm_bytes_per_s": 4.8e12}


def roofline_peaks(gpu: str = "h200") -> dict:
    """The two numbers a roofline rests on, with where each comes from: the bf16 matmul rate and
    the HBM bandwidth a device-to-device copy reaches (read + write). Measured values come from
    the roofline suite's record; a bandwidth without it from the copy in the decode-varlen
    record; a rate no run has recorded is the datasheet's (H200), and says so.
    {"flops", "bytes_per_s", "flops_source", "bytes_source"}."""
    peaks = load("roofline", gpu)
    if peaks is not None:
        where = measured_on(peaks)
        return {"flops": peaks["bf16_matmul"]["tflops"] * 1e12, "bytes_per_s": peaks["copy"]["tb_per_s"] * 1e12,
                "flops_source": f"8192³ bf16 torch.matmul, measured ({where})",
                "bytes_source": f"device-to-device copy, measured ({where})"}
    result = {"flops": H200_DATASHEET["bf16_matmul_flops"],
              "flops_source": "dense bf16 matmul, H200 datasheet (no measurement recorded yet)",
              "bytes_per_s": H200_DATASHEET["hbm_bytes_per_s"],
              "bytes_source": "HBM, H200 datasheet (no measurement recorded yet)"}
    copy = load("decode-varlen", gpu)
    if copy is not None:
        section = copy["sections"]["HBM bandwidth: 4 GiB device-to-device copy"]
        result["bytes_per_s"] = section["result"]["GBps_read_plus_write"] * 1e9
        result["bytes_source"] = f"4 GiB device-to-device copy, measured ({measured_on(copy)})"
    return result
