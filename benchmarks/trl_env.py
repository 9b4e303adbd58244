"""TRL's own environment for benchmarks/vs_trl.py: benchmarks/.trl-venv, made once and reused.

TRL is never a dependency of rlcore. The venv sees the running interpreter's site-packages through a `.pth`
line (appended to its sys.path, after its own site-packages), so torch, transformers, vLLM and datasets are
the very builds rlcore runs on; `pip install trl==VERSION` runs with a constraints file that pins every
distribution already there to its installed version, so pip adds TRL and what it lacks (accelerate, ...)
into the venv and never replaces one of rlcore's packages.
"""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

VENV = Path(__file__).resolve().parent / ".trl-venv"
TRL_VERSION = "1.16.0"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def _venv_purelib() -> Path:
    out = subprocess.run([str(venv_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def _constraints(host: str) -> str:
    """name==version of every distribution in the host's site-packages (local ones, e.g. editable rlcore, left out)."""
    pins = {}
    for dist in importlib.metadata.distributions(path=[host]):
        name = dist.metadata["Name"]
        if name and name.lower() != "rlcore":
            pins[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(sorted(pins.values())) + "\n"


def check() -> str:
    """'trl X, vllm Y, torch Z, transformers W' from inside the venv (raises if an import fails)."""
    code = ("import warnings; warnings.simplefilter('ignore'); import trl, vllm, torch, transformers; "
            "print(f'trl {trl.__version__}, vllm {vllm.__version__}, torch {torch.__version__}, "
            "transformers {transformers.__version__}, torch from {torch.__file__}')")
    out = subprocess.run([str(venv_python()), "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"TRL venv import check failed:\n{out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def ensure(version: str = TRL_VERSION) -> Path:
    """The venv's python, with trl==version importable next to the host's torch / transformers / vllm."""
    host = sysconfig.get_paths()["purelib"]
    marker = VENV / f".ready-trl-{version}"
    if marker.exists() and (VENV / "host-site.txt").read_text().strip() == host:
        return venv_python()
    if not venv_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    (_venv_purelib() / "_rlcore_host_site.pth").write_text(host + "\n")
    (VENV / "host-site.txt").write_text(host + "\n")
    constraints = VENV / "constraints.txt"
    constraints.write_text(_constraints(host))
    subprocess.run([str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    "-c", str(constraints), f"trl=={version}"], check=True)
    print(check(), flush=True)
    marker.write_text(version + "\n")
    return venv_python()


if __name__ == "__main__":
    ensure(sys.argv[1] if len(sys.argv) > 1 else TRL_VERSION)
    print(check())
