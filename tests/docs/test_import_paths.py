"""The framework import paths: ``streamio.torch`` and ``streamio.tf`` each import their own
framework only, and ``import streamio`` imports neither (each check in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_streamio_imports_no_framework():
    out = run("import sys, streamio\n"
              "print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))")
    assert out.split() == ["[]"]


def test_streamio_tf_is_the_tf_adapter_without_torch():
    pytest.importorskip("tensorflow")
    out = run("import sys\n"
              "import streamio.tf, streamio.adapters.tf as a\n"
              "print(streamio.tf.to_tf is a.to_tf,"
              " streamio.tf.resume_callback is a.resume_callback,"
              " streamio.tf.element_spec is a.element_spec, 'tensorflow' in sys.modules,"
              " 'torch' in sys.modules)\n"
              "from streamio.tf import *\n"
              "print(sorted(n for n in dir() if not n.startswith('_') and n not in ('a', 'sys',"
              " 'streamio')))")
    first, names = out.splitlines()
    assert first.split() == ["True", "True", "True", "True", "False"]
    assert names == "['element_spec', 'resume_callback', 'to_tf']"


def test_streamio_torch_does_not_import_tensorflow():
    pytest.importorskip("torch")
    out = run("import sys, streamio.torch\nprint('tensorflow' in sys.modules)")
    assert out.split() == ["False"]


def test_streamio_tf_without_tensorflow_names_the_pip_install():
    out = run("import sys; sys.modules['tensorflow'] = None\n"
              "from streamio.errors import MissingDependencyError\n"
              "try:\n    import streamio.tf\n"
              "except MissingDependencyError as e:\n    print(e)\n")
    assert "pip install" in out and "[tf]" in out, out
