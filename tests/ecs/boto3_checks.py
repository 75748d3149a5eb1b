"""boto3 against mpsfleet's ECS-compatible API: what a wrong secret, an unknown key, a skewed
clock, a viewer key and a key scoped to another pool get. Every call is boto3's own, signed by
botocore. Prints one `ok:` line per check; exits non-zero at the first that does not hold.

usage: boto3_checks.py ENDPOINT CA_FILE KEYS_JSON
KEYS_JSON: {"operator": [id, secret], "viewer": [...], "other": [...] (scoped to pool other),
            "task": ARN of a stopped task of cluster default, "family": a registered family,
            "live": ARN of a running service task of cluster default}
"""

import datetime
import json
import sys
from unittest import mock

import boto3
import botocore.auth
from botocore.exceptions import ClientError

ENDPOINT, CA, KEYS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])


def ecs(key_id, secret):
    return boto3.client("ecs", endpoint_url=ENDPOINT, region_name="us-east-1", verify=CA,
                        aws_access_key_id=key_id, aws_secret_access_key=secret)


def refused(what, code, call):
    try:
        call()
    except ClientError as e:
        got = e.response["Error"]["Code"]
        assert got == code, f"{what}: got {got}: {e.response['Error'].get('Message')}"
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400, what
        print(f"ok: {what}: {code}: {e.response['Error'].get('Message')}")
        return
    raise AssertionError(f"{what}: not refused")


op_id, op_secret = KEYS["operator"]
operator = ecs(op_id, op_secret)
assert operator.list_clusters()["clusterArns"], "the operator key lists clusters"
print("ok: the operator key's calls are answered")

refused("a wrong secret", "InvalidSignatureException", lambda: ecs(op_id, op_secret + "x").list_clusters())
refused("an unknown key", "UnrecognizedClientException", lambda: ecs("AKMFNOSUCHKEY0000000", "x").list_clusters())

# A request signed 20 minutes ago (botocore's clock moved back for this one call).
late = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=20)
with mock.patch.object(botocore.auth, "get_current_datetime", return_value=late.replace(tzinfo=None)):
    refused("a signature 20 minutes old", "InvalidSignatureException", lambda: operator.list_clusters())

viewer = ecs(*KEYS["viewer"])
assert viewer.describe_tasks(cluster="default", tasks=[KEYS["task"]])["tasks"], "a viewer reads"
refused("RunTask with a viewer key", "AccessDeniedException",
        lambda: viewer.run_task(cluster="default", taskDefinition=KEYS["family"]))

other = ecs(*KEYS["other"])
refused("a key scoped to pool other describing a task of pool default", "ClusterNotFoundException",
        lambda: other.describe_tasks(cluster="default", tasks=[KEYS["task"]]))
refused("a key scoped to pool other listing pool default's tasks", "ClusterNotFoundException",
        lambda: other.list_tasks(cluster="default"))
clusters = [c.rsplit("/", 1)[1] for c in other.list_clusters()["clusterArns"]]
assert clusters == ["other"], clusters
assert other.list_tasks(cluster="other")["taskArns"] == []
print("ok: a key scoped to pool other sees that pool only:", clusters)

# Account-level calls answer a scoped key as the REST API answers a scoped token: it reads every
# task definition, and may not register one (that reaches beyond its pool).
families = other.list_task_definition_families()["families"]
assert KEYS["family"] in families, families
refused("a key scoped to pool other registering a task definition", "AccessDeniedException",
        lambda: other.register_task_definition(family="x", containerDefinitions=[
            {"name": "c", "image": "busybox", "memory": 16}]))
print("ok: a scoped key reads task definitions and may not register one")

# Task scale-in protection: set, read back with its expiry, ended; a stopped task and a missing
# one are failures of their own; a viewer may read, not set.
before = datetime.datetime.now(datetime.timezone.utc)
got = operator.update_task_protection(cluster="default", tasks=[KEYS["live"], KEYS["task"], "t-00000000000000ff"],
                                      protectionEnabled=True, expiresInMinutes=30)
assert [t["taskArn"] for t in got["protectedTasks"]] == [KEYS["live"]], got
expires = got["protectedTasks"][0]["expirationDate"]
assert datetime.timedelta(minutes=29) < expires - before < datetime.timedelta(minutes=31), expires
reasons = sorted(f["reason"] for f in got["failures"])
assert reasons == ["MISSING", "TASK_NOT_VALID"], got["failures"]
read = viewer.get_task_protection(cluster="default", tasks=[KEYS["live"]])["protectedTasks"]
assert read[0]["protectionEnabled"] is True and read[0]["expirationDate"] == expires, read
refused("UpdateTaskProtection with a viewer key", "AccessDeniedException",
        lambda: viewer.update_task_protection(cluster="default", tasks=[KEYS["live"]], protectionEnabled=False))
off = operator.update_task_protection(cluster="default", tasks=[KEYS["live"]], protectionEnabled=False)
assert off["protectedTasks"][0]["protectionEnabled"] is False, off
print("ok: task protection is set with its expiry, read back, refused to a viewer and ended")
