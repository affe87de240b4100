"""Device names: auto picks what exists, nonsense and missing CUDA are one-line ConfigErrors."""

import pytest
import torch

from musegen.device import check_precision, native_bf16, resolve_device
from musegen.errors import ConfigError


def test_auto_picks_cuda_only_when_present():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == torch.device("cpu")


def test_nonsense_device_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("gpu-please")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        resolve_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_resolves_with_its_index():
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    # torch.cuda.set_device refuses a device without an index: training on "cuda" needs one
    for name in ("cuda", "auto", torch.device("cuda")):
        device = resolve_device(name)
        assert device.index == torch.cuda.current_device()
        torch.cuda.set_device(device)
    with pytest.raises(ConfigError, match="CUDA devices"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_nonsense_precision_is_a_config_error():
    for known in ("auto", "fp32", "bf16"):
        check_precision(known)
    with pytest.raises(ConfigError, match="precision must be one of"):
        check_precision("fp8")


def test_cpu_bf16_detection_agrees_with_the_cpu_flags():
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = {w for line in f if line.startswith(("flags", "Features")) for w in line.split(":", 1)[1].split()}
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert native_bf16(torch.device("cpu")) == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert not native_bf16(torch.device("meta"))
