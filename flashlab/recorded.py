"""Results measured on a GPU and committed to the repository under ``results/<gpu>/*.json``,
so that readers without one see real numbers, labelled with where and when they were
measured; and `environment`, the label every new measurement carries.

The recorded files are data of the FlashLab repository, not of the installed package: they
are found in the clone this package was installed from (``pip install -e .``), or in the
folder named by the environment variable FLASHLAB_RESULTS_DIR."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import torch

RESULTS_DIR = Path(os.environ.get("FLASHLAB_RESULTS_DIR", Path(__file__).resolve().parents[1] / "results"))


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


def load_recorded(name: str, gpu: str = "h200") -> dict | None:
    """The committed result ``results/<gpu>/<name>.json``, or None if the repository has none.
    Raises FileNotFoundError, in one line, when there is no repository to read from."""
    if not RESULTS_DIR.is_dir():
        raise FileNotFoundError(f"recorded results: {RESULTS_DIR} does not exist; they are data of the FlashLab "
                                "repository, so install flashlab from a clone (pip install -e .) or set "
                                "FLASHLAB_RESULTS_DIR to a clone's results/ folder.")
    path = RESULTS_DIR / gpu / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def describe(recorded: dict) -> str:
    """One line naming where and when a recorded result was measured."""
    env = recorded["environment"]
    return f"{env['gpu']}, PyTorch {env['torch']}, Triton {env['triton']}, {env['date']}"
