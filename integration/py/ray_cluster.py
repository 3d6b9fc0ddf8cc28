"""The real local Ray cluster the tests' Ray scripts run on (ray_read.py, ray_write.py,
ray_layouts.py, imported from their directory): two one-CPU nodes on this machine
(ray.cluster_utils.Cluster: two raylets), Ray connected to it."""

import contextlib


@contextlib.contextmanager
def two_nodes(labels=None):
    """Start the cluster, connect, wait for both nodes; yield the second node's ``Node``
    (``.node_id``), which carries ``labels`` when given; shut it all down after, also when
    starting it failed part way."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        second = cluster.add_node(num_cpus=1, **({"labels": labels} if labels else {}))
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield second
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
