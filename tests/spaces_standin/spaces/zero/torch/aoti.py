"""Stand-in for spaces.zero.torch.aoti: a compiled model is an exported program run with a given set of weights."""
import torch


class ZeroGPUWeights:
    def __init__(self, constants_map: dict):
        self.constants_map = {name: tensor.detach().clone() for name, tensor in constants_map.items()}


class ZeroGPUCompiledModel:
    def __init__(self, archive_file, weights: ZeroGPUWeights):
        self.archive_file = archive_file
        self.weights = weights
        self._module = archive_file.module()

    def __call__(self, *args, **kwargs):
        return torch.func.functional_call(self._module, self.weights.constants_map, args, kwargs)
