"""The tpu graph runner's plain stand-ins for the msgspec Structs a decoder layer builds while it runs.

Dynamo can neither construct nor mutate a ``msgspec.Struct``; the stand-ins
must behave as the Structs do wherever SGLang uses them, and replace them in
every SGLang module that holds them.
"""

import pytest
import torch

pytest.importorskip("sglang", reason="SGLang is not installed: ./scripts/setup_engines.sh installs it")

import msgspec  # noqa: E402
from sglang.srt.layers.layer_boundary.residual import access, stream  # noqa: E402

from torchtpu.integrations.sglang.graph_runner import plain_class, use_plain_structs  # noqa: E402

ORIGINAL_CONTRIBUTION = stream.Contribution


def test_plain_class_keeps_fields_defaults_and_methods():
    plain = plain_class(ORIGINAL_CONTRIBUTION)
    assert not issubclass(plain, msgspec.Struct)
    value = torch.ones(2)
    for cls in (ORIGINAL_CONTRIBUTION, plain):
        positional, keyword = cls(value, "update"), cls(value=value, update="update", owed=None)
        for made in (positional, keyword):
            assert (made.value, made.update, made.owed) == (value, "update", None)  # owed's default
            assert made.complete() is value  # nothing owed: the value itself
            assert made.for_boundary() is value
            made.release()
            assert (made.value, made.update, made.owed) == (None, None, None)
    with pytest.raises(TypeError):
        plain()  # value and update have no default, as in the Struct
    assert plain(value, "u") != plain(value, "u")  # identity, as the residual stream's `is` checks assume


def test_use_plain_structs_replaces_them_in_every_sglang_module():
    use_plain_structs()
    assert not issubclass(stream.Contribution, msgspec.Struct)
    assert not issubclass(stream.OwedOutput, msgspec.Struct)
    assert access.OwedOutput is stream.OwedOutput  # a module that imported the name
    replaced = stream.Contribution
    use_plain_structs()  # a second call changes nothing
    assert stream.Contribution is replaced
