from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.egress_record import EgressRecord


T = TypeVar("T", bound="EgressLog")


@_attrs_define
class EgressLog:
    """
    Attributes:
        egress (list[EgressRecord]):
    """

    egress: list[EgressRecord]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        egress = []
        for egress_item_data in self.egress:
            egress_item = egress_item_data.to_dict()
            egress.append(egress_item)

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "egress": egress,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.egress_record import EgressRecord

        d = dict(src_dict)
        egress = []
        _egress = d.pop("egress")
        for egress_item_data in _egress:
            egress_item = EgressRecord.from_dict(egress_item_data)

            egress.append(egress_item)

        egress_log = cls(
            egress=egress,
        )

        egress_log.additional_properties = d
        return egress_log

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
