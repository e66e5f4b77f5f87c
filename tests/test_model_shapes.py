"""Model.clean() refuses JSON values of the wrong shape with a ValidationError naming the field, never a
TypeError: the admin, the console's forms, the API and `apply` all run it."""
import pytest
from django.core.exceptions import ValidationError

from pools.models import NodePool, NodeProvider, NodeType, OSImage, Tenant

pytestmark = pytest.mark.django_db

CASES = [
    (NodePool, {"node_type_selector": "gpu"}, "node_type_selector"),
    (NodePool, {"node_type_selector": [{"property": "a", "values": 5}]}, "node_type_selector"),
    (NodePool, {"node_type_selector": [{"property": "a", "operator": ["In"], "value": "x"}]}, "node_type_selector"),
    (NodePool, {"taints": [{"key": "a", "effect": ["NoSchedule"]}]}, "taints"),
    (NodePool, {"disruption": {"budgets": 5}}, "disruption"),
    (NodePool, {"disruption": {"consolidationPolicy": ["x"]}}, "disruption"),
    (NodePool, {"kind": "dynamic", "quantity": None, "limits": {"cpu": "1e400"}}, "limits"),
    (NodePool, {"kind": "dynamic", "quantity": None, "limits": {"cpu": [1]}}, "limits"),
    (NodeType, {"host_selector": {"matchExpressions": 5}}, "host_selector"),
    (NodeType, {"host_selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": 5}]}}, "host_selector"),
    (NodeType, {"resources": {"cpu": "1e999"}}, "resources"),
    (NodeType, {"resources": {"cpu": "nan"}}, "resources"),
    (NodeType, {"resources": ["cpu"]}, "resources"),
    (NodeType, {"properties": {"a": 5}}, "properties"),
    (NodeType, {"erase_verify_share": float("nan")}, "erase_verify_share"),
    (NodeType, {"health_nccl_min_busbw_gbps": float("inf")}, "health_nccl_min_busbw_gbps"),
    (NodeProvider, {"config": ["clusterRef"]}, "config"),
    (OSImage, {"properties": {"size": [1]}}, "properties"),
    (Tenant, {"provider_properties": {"metal3": 5}}, "provider_properties"),
]


def valid(model):
    provider = NodeProvider.objects.get_or_create(name="metal3")[0]
    tenant = Tenant.objects.get_or_create(name="one")[0]
    return {
        NodePool: lambda: NodePool(tenant=tenant, provider=provider, name="gpu", quantity=1),
        NodeType: lambda: NodeType(name="gpu-server", provider=provider),
        NodeProvider: lambda: NodeProvider(name="rack2"),
        OSImage: lambda: OSImage(name="img", url="http://127.0.0.1/x.raw", checksum="ab" * 32),
        Tenant: lambda: Tenant(name="two"),
    }[model]()


@pytest.mark.parametrize("model, values, field", CASES, ids=[f"{m.__name__}-{v}" for m, v, _ in CASES])
def test_a_json_value_of_the_wrong_shape_is_a_validation_error_on_its_field(model, values, field):
    obj = valid(model)
    obj.full_clean()  # the valid object passes: the error below is the bad value's
    for name, value in values.items():
        setattr(obj, name, value)
    with pytest.raises(ValidationError) as info:
        obj.full_clean()
    assert field in info.value.message_dict, info.value.message_dict


def test_every_bad_field_of_a_node_type_is_reported_at_once():
    obj = valid(NodeType)
    obj.cleaning_fallback = obj.cleaning_policy
    obj.erase_verify_share = 2
    obj.resources = {"cpu": "lots"}
    with pytest.raises(ValidationError) as info:
        obj.full_clean()
    assert {"cleaning_fallback", "erase_verify_share", "resources"} <= set(info.value.message_dict)
