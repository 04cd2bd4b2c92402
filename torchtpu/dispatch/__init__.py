"""The dispatch layer: torchtpu's place in PyTorch's dispatcher.

``registration`` installs the device and every kernel; ``kernels`` holds
the native kernels (allocation, metadata, copies, host reads),
``attention`` the SDPA autograd kernel, ``autocast`` the autocast policy,
``fallback`` what runs an op with no lowering, and ``patches`` the few
PyTorch functions a Python backend has to replace (``Module.to``,
``torch.accelerator``'s memory functions, storage serialization).
"""
