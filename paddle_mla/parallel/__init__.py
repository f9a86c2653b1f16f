"""Scale-out on one host: tensor and expert parallelism (docs/scaling_out.md).

- ``paddle_mla.models.sharding``: which slice of each checkpoint tensor a rank holds, and under
  ``parallel.expert_parallel`` which whole routed experts (plain Python, no tensors);
- ``group``: the torch.distributed group of one engine and its collectives (all-reduce, the
  vocab-parallel embedding and logits gather);
- ``launcher``: rank 0's side (spawns the workers, forms the group, sends each step's batch,
  watches the workers); ``worker``: the loop of ranks 1..N-1.

Importing this package imports no tensor library; ``group`` (torch.distributed) is imported only
when a run has ``parallel.tensor_parallel_size`` > 1, which is torch-only.
"""
