from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="RunLimits")


@_attrs_define
class RunLimits:
    """The limits a run is queued with (each replaces the manifest's); kept
    with the queued run in this form.

        Attributes:
            cpus (float | Unset): CPUs, as the manifest's agent.cpus
            memory_mb (int | Unset): MiB of memory, as the manifest's agent.memory_mb
            timeout_seconds (int | None | Unset): Seconds, at least 1.
    """

    cpus: float | Unset = UNSET
    memory_mb: int | Unset = UNSET
    timeout_seconds: int | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        cpus = self.cpus

        memory_mb = self.memory_mb

        timeout_seconds: int | None | Unset
        if isinstance(self.timeout_seconds, Unset):
            timeout_seconds = UNSET
        else:
            timeout_seconds = self.timeout_seconds

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if cpus is not UNSET:
            field_dict["cpus"] = cpus
        if memory_mb is not UNSET:
            field_dict["memory_mb"] = memory_mb
        if timeout_seconds is not UNSET:
            field_dict["timeout_seconds"] = timeout_seconds

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        cpus = d.pop("cpus", UNSET)

        memory_mb = d.pop("memory_mb", UNSET)

        def _parse_timeout_seconds(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        timeout_seconds = _parse_timeout_seconds(d.pop("timeout_seconds", UNSET))

        run_limits = cls(
            cpus=cpus,
            memory_mb=memory_mb,
            timeout_seconds=timeout_seconds,
        )

        return run_limits
