"""c10d_rs declares the PyTorch versions it works with and refuses others at import."""

from __future__ import annotations

import importlib
import pathlib
import re
import sys

import pytest
import torch

import c10d_rs
from c10d_rs._version import SUPPORTED, check_torch


@pytest.mark.parametrize("version", ["2.15.0", "2.15.0+cpu", "2.15.1+cu132", "2.15"])
def test_supported_versions_pass(version: str) -> None:
    check_torch(version)


@pytest.mark.parametrize("version", ["2.4.0", "2.14.1+cpu", "2.16.0", "3.0.0", "nightly"])
def test_other_versions_are_refused(version: str) -> None:
    with pytest.raises(ImportError, match=re.escape(f"torch{SUPPORTED}")):
        check_torch(version)


def test_import_under_unsupported_torch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    monkeypatch.delitem(sys.modules, "c10d_rs")
    with pytest.raises(ImportError, match=r"torch>=2\.15,<2\.16.*found torch 2\.14\.0"):
        importlib.import_module("c10d_rs")


def test_installed_torch_is_supported() -> None:
    check_torch(torch.__version__)
    assert c10d_rs.SUPPORTED_TORCH == SUPPORTED


def test_pyproject_declares_the_same_range() -> None:
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not run from the source tree")
    assert f'"torch{SUPPORTED}"' in pyproject.read_text()
