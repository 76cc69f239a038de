"""Reference for the distributed sampler: torch.utils.data.DistributedSampler itself.
argv[1]: JSON list of [n, world, seed, epoch, shuffle, drop_last]; prints, per case, every
rank's index list as JSON."""
import json
import sys

from torch.utils.data import DistributedSampler

out = []
for n, world, seed, epoch, shuffle, drop_last in json.loads(sys.argv[1]):
    ranks = []
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed,
                                     shuffle=bool(shuffle), drop_last=bool(drop_last))
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
    out.append(ranks)
print(json.dumps(out))
