"""What the CLI's start-up and the packaged data loaders load (performance review, 2026-12-02):
registering the commands must not import the simulator, numpy or the hardware catalog; a
device's kernel models must not decode every device's packaged file; the packaged catalog
parses to the same documents with libyaml as with PyYAML's own loader."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import yaml


def test_registering_the_commands_imports_no_simulator_numpy_or_catalog():
    code = ("import sys, trainsim.cli.main as m; m._register(); "
            "print(','.join(k for k in ('numpy', 'trainsim.sim.result', 'trainsim.sim.engine', "
            "'trainsim.hardware.catalog') if k in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_lazy_result_names_of_the_sim_package_resolve():
    from trainsim import sim
    from trainsim.sim.result import SimResult

    assert sim.SimResult is SimResult
    try:
        sim.NoSuchName  # noqa: B018
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:  # pragma: no cover
        raise AssertionError("an unknown name must raise AttributeError")


def test_a_devices_kernel_models_decode_only_its_own_packaged_file():
    from trainsim.kernels import registry

    files = registry._shipped_files()
    devices = {d for _, _, d in files}
    assert len(files) >= 2 and None not in devices  # every packaged manifest names its device
    for dev in devices:
        mine = registry._shipped_for(dev)
        assert mine and {m.device for m in mine} == {dev}
    assert len(registry.shipped_models()) == sum(len(registry._shipped_for(d)) for d in devices)


def test_packaged_catalog_parses_the_same_with_libyaml():
    from trainsim.hardware.catalog import _FAST_LOADER

    folder = resources.files("trainsim.hardware").joinpath("data")
    names = [e for e in folder.iterdir() if e.name.endswith(".yaml")]
    assert names
    for e in names:
        text = e.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=_FAST_LOADER) == yaml.safe_load(text), e.name


def test_a_measured_replay_imports_no_kernel_models_resize_or_catalog():
    """Performance review 2026-12-03: ``replay --kernels measured`` (the default) had imported
    the kernel-model package, the resize passes and the hardware catalog (YAML, pydantic) it
    never uses: the simulator read a constant of the resize module, the CLI loaded an empty
    ``--kernel-models`` list through the kernel package."""
    from tests.conftest import DLRM_DIR

    code = ("import runpy, sys; sys.argv = ['trainsim', 'replay', sys.argv[1], '--format', 'json']\n"
            "try:\n    runpy.run_module('trainsim', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('LOADED:' + ','.join(k for k in ('trainsim.kernels', 'trainsim.sim.resize', "
            "'trainsim.hardware.catalog') if k in sys.modules), file=sys.stderr)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(DLRM_DIR)], capture_output=True, text=True, check=True)
    assert '"predicted_step_s"' in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "LOADED:"


def test_validate_clears_the_artifact_variables_without_importing_the_registries():
    """`trainsim validate` cleared $TRAINSIM_KERNEL_MODELS / $TRAINSIM_COMM_MODELS by importing both
    registries (~0.24 s) to read two names (performance review); the names live in envvars."""
    from trainsim import envvars
    from trainsim.comm import registry as comm_registry
    from trainsim.kernels import registry as kernel_registry

    assert comm_registry.USER_MODELS_ENV == envvars.COMM_MODELS_ENV == "TRAINSIM_COMM_MODELS"
    assert kernel_registry.USER_MODELS_ENV == envvars.KERNEL_MODELS_ENV == "TRAINSIM_KERNEL_MODELS"
    import inspect

    from trainsim.cli import validate_cmd

    src = inspect.getsource(validate_cmd)
    assert "comm.registry" not in src and "kernels.registry" not in src
