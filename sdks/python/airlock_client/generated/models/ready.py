from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Ready")


@_attrs_define
class Ready:
    """`/readyz`: the store answers and this replica takes work.

    Attributes:
        backend (str): The sandbox backend its runs use.
        replica (str): This replica's id.
        running (int): Runs running on this replica.
        status (str): `ready`.
    """

    backend: str
    replica: str
    running: int
    status: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        backend = self.backend

        replica = self.replica

        running = self.running

        status = self.status

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "backend": backend,
                "replica": replica,
                "running": running,
                "status": status,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        backend = d.pop("backend")

        replica = d.pop("replica")

        running = d.pop("running")

        status = d.pop("status")

        ready = cls(
            backend=backend,
            replica=replica,
            running=running,
            status=status,
        )

        ready.additional_properties = d
        return ready

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
