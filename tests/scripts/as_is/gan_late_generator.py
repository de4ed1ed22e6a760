"""A GAN with two optimizers: the critic steps every iteration, the generator first at iteration 10.

The generator is large (about 21 M parameters) and trained with Adam: its first step adds its gradients and
two moments, more than the critic's whole step, so a probe that stops before iteration 10 misses them.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="a GAN whose generator trains after a warm-up of the critic")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--iterations", type=int, default=1000)
parser.add_argument("--generator-start", type=int, default=10, help="iteration of the generator's first step")
parser.add_argument("--latent", type=int, default=64)
args = parser.parse_args()

torch.manual_seed(0)
SIDE = 32
real = torch.rand(2048, SIDE * SIDE)  # 8 MiB of "images"
loader = DataLoader(TensorDataset(real), batch_size=args.batch_size, shuffle=True, drop_last=True)

generator = nn.Sequential(
    nn.Linear(args.latent, 4096),
    nn.ReLU(),
    nn.Linear(4096, 4096),
    nn.ReLU(),
    nn.Linear(4096, SIDE * SIDE),
    nn.Sigmoid(),
)
critic = nn.Sequential(nn.Linear(SIDE * SIDE, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(critic.parameters(), lr=2e-4, betas=(0.5, 0.999))

iteration = 0
while iteration < args.iterations:
    for (images,) in loader:
        noise = torch.randn(images.shape[0], args.latent)
        fake = generator(noise)
        ones, zeros = torch.ones(images.shape[0], 1), torch.zeros(images.shape[0], 1)
        loss_d = F.binary_cross_entropy_with_logits(critic(images), ones)
        loss_d = loss_d + F.binary_cross_entropy_with_logits(critic(fake.detach()), zeros)
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        if iteration >= args.generator_start:
            loss_g = F.binary_cross_entropy_with_logits(critic(fake), ones)
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
        if iteration % 50 == 0:
            print(f"iteration {iteration} loss_d {loss_d.item():.3f}")
        iteration += 1
        if iteration >= args.iterations:
            break
