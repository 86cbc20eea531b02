from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="OpenIdConfiguration")


@_attrs_define
class OpenIdConfiguration:
    """`/.well-known/openid-configuration`: the workload identity issuer's
    OpenID Connect discovery document (what a cloud's STS reads to trust
    the runs' identity tokens).

        Attributes:
            claims_supported (list[str]): The claims a token carries.
            id_token_signing_alg_values_supported (list[str]): `["ES256"]`.
            issuer (str): The issuer URL: every token's `iss`.
            jwks_uri (str): Where the issuer's public keys are (`/.well-known/jwks.json`).
            response_types_supported (list[str]): `["id_token"]`.
            subject_types_supported (list[str]): `["public"]`.
    """

    claims_supported: list[str]
    id_token_signing_alg_values_supported: list[str]
    issuer: str
    jwks_uri: str
    response_types_supported: list[str]
    subject_types_supported: list[str]
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        claims_supported = self.claims_supported

        id_token_signing_alg_values_supported = (
            self.id_token_signing_alg_values_supported
        )

        issuer = self.issuer

        jwks_uri = self.jwks_uri

        response_types_supported = self.response_types_supported

        subject_types_supported = self.subject_types_supported

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "claims_supported": claims_supported,
                "id_token_signing_alg_values_supported": id_token_signing_alg_values_supported,
                "issuer": issuer,
                "jwks_uri": jwks_uri,
                "response_types_supported": response_types_supported,
                "subject_types_supported": subject_types_supported,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        claims_supported = cast(list[str], d.pop("claims_supported"))

        id_token_signing_alg_values_supported = cast(
            list[str], d.pop("id_token_signing_alg_values_supported")
        )

        issuer = d.pop("issuer")

        jwks_uri = d.pop("jwks_uri")

        response_types_supported = cast(list[str], d.pop("response_types_supported"))

        subject_types_supported = cast(list[str], d.pop("subject_types_supported"))

        open_id_configuration = cls(
            claims_supported=claims_supported,
            id_token_signing_alg_values_supported=id_token_signing_alg_values_supported,
            issuer=issuer,
            jwks_uri=jwks_uri,
            response_types_supported=response_types_supported,
            subject_types_supported=subject_types_supported,
        )

        open_id_configuration.additional_properties = d
        return open_id_configuration

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
