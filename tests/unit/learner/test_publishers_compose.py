"""The publishers (issue 43): each implements the WeightPublisher protocol and none inherits
another; what they share is held, not inherited (Replicas, a transport, a full publisher)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Protocol

from typing_extensions import is_typeddict

from learner.swap import full_publisher, lora_publisher, transfer
from learner.swap.full_publisher import DiskReload, FullWeightPublisher
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.publisher import Probe, WeightPublisher
from learner.swap.transfer import WeightFileTransfer, transfer_publisher

PUBLISHERS = (FullWeightPublisher, LoraPublisher)


def test_no_publisher_or_transport_inherits_another_class() -> None:
    classes = [
        cls
        for module in (full_publisher, lora_publisher, transfer)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
        and not issubclass(cls, BaseException)
        and not is_typeddict(cls)  # a record's shape (issue 43 step 5), not a publisher
    ]
    assert {c.__name__ for c in classes} >= {
        "FullWeightPublisher",
        "LoraPublisher",
        "DiskReload",
        "WeightFileTransfer",
    }
    for cls in classes:
        bases = [b for b in cls.__bases__ if b is not object]
        assert bases in ([], [Protocol]), (cls, bases)  # a protocol names what it asks


def test_each_publisher_has_what_the_protocol_asks(tmp_path: Path) -> None:
    """The loop holds a publisher as a WeightPublisher: every member it names, on each kind."""
    asked = {
        name
        for name in [*vars(WeightPublisher), *WeightPublisher.__annotations__]
        if not name.startswith("_")
    }
    assert asked >= {"publish", "rollback", "upstreams", "close", "last_good"}
    built = [
        FullWeightPublisher(["http://127.0.0.1:9"], probe=Probe([1, 2]), last_good=tmp_path),
        LoraPublisher(["http://127.0.0.1:9"], probe=Probe([1, 2]), last_good=tmp_path),
    ]
    for publisher in built:
        assert type(publisher) in PUBLISHERS
        for name in asked:
            assert hasattr(publisher, name), (type(publisher), name)
        for method in ("publish", "rollback"):
            ours = inspect.signature(getattr(publisher, method))
            wanted = inspect.signature(getattr(WeightPublisher, method))
            assert set(wanted.parameters) - {"self"} <= set(ours.parameters), (publisher, method)
        assert publisher.upstreams == ["http://127.0.0.1:9"]
        assert publisher.last_good == tmp_path.resolve()


def test_the_transfer_publisher_is_a_full_publisher_holding_the_weight_file_transport(
    tmp_path: Path,
) -> None:
    built = transfer_publisher(["http://127.0.0.1:9/"], probe=Probe([1, 2]), weight_dir=tmp_path)
    assert isinstance(built, FullWeightPublisher)
    assert isinstance(built.transport, WeightFileTransfer)
    assert list(built.transport.files) == ["http://127.0.0.1:9"] == built.upstreams
    plain = FullWeightPublisher(["http://127.0.0.1:9"], probe=Probe([1, 2]), check_files=False)
    assert isinstance(plain.transport, DiskReload) and not plain.transport.check_files
    lora = LoraPublisher(["http://127.0.0.1:9"], probe=Probe([1, 2]))
    assert lora.full.replicas is lora.replicas  # one set of replicas, one way to call them
    lora.last_good = tmp_path  # what the learner sets after an operator's swap
    assert lora.full.last_good == tmp_path
