"""comms.parallel: Megatron-LM's RankGenerator and model-parallel group collections."""
from ._comms import parallel as _parallel

RankGenerator = _parallel.RankGenerator
ParallelConfig = _parallel.ParallelConfig
ProcessGroupCollection = _parallel.ProcessGroupCollection
parse_parallel_flags = _parallel.parse_parallel_flags
plan_model_parallel = _parallel.plan_model_parallel
group_names = _parallel.group_names
recover_model_parallel = _parallel.recover_model_parallel
admit_model_parallel = _parallel.admit_model_parallel
why_layout_cannot_shrink = _parallel.why_layout_cannot_shrink
DROP_REPLICAS = "drop_replicas"


def initialize_model_parallel(config=None, communicator_config=None, **fields):
    """Builds every group of a layout (collective over the world).

    config: a ParallelConfig, or a layout string "tp=2,pp=2,order=tp-pp-dp" as
    comms-info --parallel takes it; fields (tp=2, pp=2, order=..., name=...)
    are set on it. communicator_config: per-group options, Megatron's YAML.
    """
    if config is None:
        config = ParallelConfig()
    elif isinstance(config, str):
        config, world, dp = parse_parallel_flags(config)
        if world is not None:
            fields.setdefault("world_size", world)
    for key, value in fields.items():
        if not hasattr(config, key):
            raise TypeError("ParallelConfig has no field %r" % key)
        setattr(config, key, value)
    if communicator_config is not None:
        config.set_communicator_config(communicator_config)
    return _parallel.initialize_model_parallel(config)


__all__ = ["RankGenerator", "ParallelConfig", "ProcessGroupCollection", "parse_parallel_flags",
           "plan_model_parallel", "group_names", "initialize_model_parallel", "recover_model_parallel",
           "admit_model_parallel",
           "why_layout_cannot_shrink", "DROP_REPLICAS"]
