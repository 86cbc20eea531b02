from http import HTTPStatus
from typing import Any

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.error import Error
from ...models.org_budget import OrgBudget
from ...models.set_org_budget import SetOrgBudget
from ...types import Response


def _get_kwargs(
    *,
    body: SetOrgBudget,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "put",
        "url": "/v1/org/budget",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Error | OrgBudget | None:
    if response.status_code == 200:
        response_200 = OrgBudget.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Error.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 413:
        response_413 = Error.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Error.from_dict(response.json())

        return response_415

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 429:
        response_429 = Error.from_dict(response.json())

        return response_429

    if response.status_code == 500:
        response_500 = Error.from_dict(response.json())

        return response_500

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if response.status_code == 507:
        response_507 = Error.from_dict(response.json())

        return response_507

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[Error | OrgBudget]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient,
    body: SetOrgBudget,
) -> Response[Error | OrgBudget]:
    """Sets the organization's model budgets and the thresholds at which its
    webhooks hear of each budget's spend; runs already going keep them from
    their next model call.

    Args:
        body (SetOrgBudget): `PUT /v1/org/budget`: the organization's model budgets per UTC day
            and
            per UTC month (`{}`: no limit in that period), and the thresholds at
            which its webhooks hear of each budget's spend.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | OrgBudget]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient,
    body: SetOrgBudget,
) -> Error | OrgBudget | None:
    """Sets the organization's model budgets and the thresholds at which its
    webhooks hear of each budget's spend; runs already going keep them from
    their next model call.

    Args:
        body (SetOrgBudget): `PUT /v1/org/budget`: the organization's model budgets per UTC day
            and
            per UTC month (`{}`: no limit in that period), and the thresholds at
            which its webhooks hear of each budget's spend.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | OrgBudget
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient,
    body: SetOrgBudget,
) -> Response[Error | OrgBudget]:
    """Sets the organization's model budgets and the thresholds at which its
    webhooks hear of each budget's spend; runs already going keep them from
    their next model call.

    Args:
        body (SetOrgBudget): `PUT /v1/org/budget`: the organization's model budgets per UTC day
            and
            per UTC month (`{}`: no limit in that period), and the thresholds at
            which its webhooks hear of each budget's spend.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[Error | OrgBudget]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient,
    body: SetOrgBudget,
) -> Error | OrgBudget | None:
    """Sets the organization's model budgets and the thresholds at which its
    webhooks hear of each budget's spend; runs already going keep them from
    their next model call.

    Args:
        body (SetOrgBudget): `PUT /v1/org/budget`: the organization's model budgets per UTC day
            and
            per UTC month (`{}`: no limit in that period), and the thresholds at
            which its webhooks hear of each budget's spend.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Error | OrgBudget
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
