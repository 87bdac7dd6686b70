"""What accelerators this container sees: CUDA GPUs and NeuronCores, counted as the AWS images count
them. The launcher (how many ranks) and the XLA path (whether a job is on it) both ask here."""

from __future__ import annotations

from pathlib import Path


def device_counts(instance_type: str, neuron_cores: int | None) -> tuple[int, int]:
    """(GPUs, NeuronCores) visible to this container; NeuronCores counted as the AWS images do:
    `neuron_cores`, what the Neuron runtime's variables say (the settings' `neuron_cores`), else the devices."""
    import torch  # only when counting: the launcher and its errors import without torch (see byoc.errors)

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = 0
    if neuron_cores is not None:
        cores = neuron_cores
    elif Path("/dev/neuron0").exists():
        from sagemaker_training.environment import num_neurons  # runs `neuron-ls -j`, as the DLCs do

        cores = num_neurons(instance_type)
    return gpus, cores


def count_core_list(spec: str) -> int:
    """NEURON_RT_VISIBLE_CORES syntax: "0-3,8" -> 5 cores."""
    total = 0
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        total += int(high) - int(low) + 1 if high else 1
    return total
