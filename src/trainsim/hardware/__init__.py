"""Hardware catalogs: devices (datasheet peaks) and systems (GPUs per node, network tiers).

>>> from trainsim.hardware import get_system
>>> get_system("dgx-a100").gpus_per_node
8
"""

from trainsim.hardware.catalog import (
    catalog_name,
    find_device,
    get_device,
    get_system,
    list_devices,
    list_systems,
)
from trainsim.hardware.schema import (
    DeviceSpec,
    NetworkTier,
    Source,
    SystemSpec,
    TierKind,
    TierScope,
)

__all__ = [
    "DeviceSpec",
    "NetworkTier",
    "Source",
    "SystemSpec",
    "TierKind",
    "TierScope",
    "catalog_name",
    "find_device",
    "get_device",
    "get_system",
    "list_devices",
    "list_systems",
]
