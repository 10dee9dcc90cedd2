"""The Python a script of ddp's needs (the plot scripts' matplotlib): where the interpreter that
runs it (the first python3 on PATH, through the script's #! line) lacks a module, the script
runs again under DDP_PYTHON, else Debian's /usr/bin/python3, if that one has it (once); else it
stops with one line naming the interpreter, the module and the ways to get it.
"""
import importlib
import os
import subprocess
import sys


def require(module, debian_package):
    """`module`, imported; or the script re-run under an interpreter that has it, or an exit."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        pass
    chosen = os.environ.get("DDP_PYTHON")
    candidates = [chosen] if chosen else ["/usr/bin/python3"]
    if not os.environ.get("DDP_PYTHON_RERUN"):
        for python in candidates:
            if not python or not os.access(python, os.X_OK):
                continue
            has = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
            if has.returncode == 0:
                os.environ["DDP_PYTHON_RERUN"] = "1"
                os.execv(python, [python] + sys.argv)
    sys.exit(
        f"{os.path.basename(sys.argv[0])}: {sys.executable} has no {module}"
        f"{' (nor has DDP_PYTHON ' + chosen + ')' if chosen else ''}; install {debian_package} "
        f"(Debian) or set DDP_PYTHON to a Python that has {module}"
    )
