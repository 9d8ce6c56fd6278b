"""The PyTorch versions c10d_rs works with, checked at import.

The package leans on PyTorch internals that change between releases: the extended backend
creator's arguments, the ``ProcessGroup`` methods ``_register_backend`` and
``_set_default_backend``, the creator's caller ``_new_process_group_helper`` and its local
``backend_config`` (``_group``), how a Python backend's ``Work`` is wrapped (``PyWorkHolder``),
and Gloo's error texts its argument checks copy (``_backend``). It is built and tested against
PyTorch 2.15 only (``cargo xtask python``), so that is what it declares (``pyproject.toml``) and
accepts; widen both together once another release passes the suite.
"""

from __future__ import annotations

import re

#: The supported range, as ``pyproject.toml`` declares it.
SUPPORTED = ">=2.15,<2.16"
_LOW, _HIGH = (2, 15), (2, 16)


def check_torch(version: str) -> None:
    """Raises ``ImportError`` naming the supported range unless ``version`` (a
    ``torch.__version__`` such as "2.15.0+cpu") is in it."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if m is None or not (_LOW <= (int(m.group(1)), int(m.group(2))) < _HIGH):
        raise ImportError(
            f"c10d_rs supports torch{SUPPORTED} (it relies on that release's internals); "
            f"found torch {version}. Install a supported torch, e.g. pip install 'torch{SUPPORTED}'"
        )
