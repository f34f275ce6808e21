"""What CUDA's path chooses by the GPU at hand (models/hf/shared_prefix.py, compiled_layers.py, on_device.py),
asked of a GPU faked by its compute capability: FlexAttention from Ampere on, compiled layers from Volta on,
and the switches that turn each off; CUDA's path set up on a CPU (bench/launches.py) is a current GPU's."""

from __future__ import annotations

import pytest
import torch

from verbmirage.models.hf import compiled_layers, on_device, shared_prefix

CUDA = torch.device("cuda")


@pytest.fixture
def gpu(monkeypatch):
    """Set the faked GPU's compute capability (major, minor)."""
    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (major, minor))
        compiled_layers._capability.cache_clear()

    yield set_capability
    compiled_layers._capability.cache_clear()


@pytest.mark.parametrize("capability, kernel, compiled, compiled_bf16", [
    ((9, 0), "flex", True, True),  # H100, H200
    ((8, 0), "flex", True, True),  # A100
    ((7, 5), "plain", True, False),  # T4: no FlexAttention; compiled layers, but not in bfloat16 (none native)
    ((7, 0), "plain", True, False),  # V100
    ((6, 0), "plain", False, False),  # P100: older than Triton's GPUs
])
def test_flex_attention_and_compiled_layers_where_the_gpu_runs_them(gpu, capability, kernel, compiled,
                                                                    compiled_bf16):
    gpu(*capability)
    assert shared_prefix.kernel_for(CUDA) == kernel
    assert shared_prefix.kernel_for(CUDA, dim=8) == "plain"  # heads smaller than FlexAttention takes
    assert compiled_layers.compiles_layers(CUDA) == compiled
    assert compiled_layers.compiles_layers(CUDA, torch.float16) == compiled
    assert compiled_layers.compiles_layers(CUDA, torch.bfloat16) == compiled_bf16
    assert shared_prefix.kernel_for(torch.device("cpu")) == "cpu_flash"


def test_the_switches_turn_each_off_and_the_log_says_why(gpu, monkeypatch):
    gpu(7, 5)
    assert on_device._attention_kernel(CUDA, 128) == ("in plain products (FlexAttention needs compute capability "
                                                       "8.0; this GPU has 7.5)")
    gpu(9, 0)
    assert on_device._attention_kernel(CUDA, 128).startswith("in FlexAttention's fused kernels")
    assert on_device._attention_kernel(CUDA, 8) == "in plain products (heads of 8: FlexAttention takes 16 or more)"
    monkeypatch.setenv(shared_prefix.FLEX_ENV, "0")
    monkeypatch.setenv(compiled_layers.ENV, "off")
    assert shared_prefix.kernel_for(CUDA) == "plain" and not compiled_layers.compiles_layers(CUDA)
    assert on_device._attention_kernel(CUDA, 128) == "in plain products (VERBMIRAGE_FLEX_ATTENTION says no)"


def test_cudas_path_set_up_on_a_cpu_is_a_current_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    compiled_layers._capability.cache_clear()
    try:
        assert shared_prefix.kernel_for(CUDA) == "flex" and compiled_layers.compiles_layers(CUDA, torch.bfloat16)
        with shared_prefix.use_kernel("plain"):
            assert shared_prefix.kernel_for(CUDA) == "plain"
    finally:
        compiled_layers._capability.cache_clear()


def test_the_device_path_kept_with_a_jobs_sizes_names_the_gpu_and_its_kernels(gpu, monkeypatch):
    """The transformers engine's ``device_path`` (kept beside a job's batch sizes: docs/models.md, "Batch
    sizes"): the GPU's name and capability, the kernel that attends over shared prefixes at the model's head
    size, and whether its layers compile; nothing on the CPU."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")
    gpu(7, 5)
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32)  # heads of 128, as LLaVA-1.5-7B's
    weights = {"dtype": torch.float16}
    model = SimpleNamespace(config=config, parameters=lambda: iter([torch.zeros(1, dtype=weights["dtype"])]))
    engine = SimpleNamespace(device=CUDA, model=model, shared_prefix_attention=True)
    assert on_device.engine_device_path(engine) == {"gpu": "Tesla T4", "capability": "7.5", "attention": "plain",
                                                    "compiled_layers": True}
    weights["dtype"] = torch.bfloat16  # no native bfloat16 on a T4: the layers run eagerly
    assert on_device.engine_device_path(engine)["compiled_layers"] is False
    engine.shared_prefix_attention = False  # a family that attends through transformers' own code
    assert on_device.engine_device_path(engine)["attention"] == "transformers"
    assert on_device.engine_device_path(SimpleNamespace(device=torch.device("cpu"))) is None

