"""A ResNet-style CNN written with torch.nn (no torchvision): basic blocks, batch norm, 3 stages."""

from __future__ import annotations

import torch
from torch import nn

from trainsim.capture.examples import TrainingStep

IMAGE_SIZE = 32
CLASSES = 10
WIDTHS = (16, 32, 64)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, stride=1 if i == 0 else 2))
            cin = w
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _loss(module: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(module(images), labels)


def build(*, batch_size: int, device: str, seed: int) -> TrainingStep:
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    model = ResNet(WIDTHS, CLASSES)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    labels = torch.randint(0, CLASSES, (batch_size,), generator=g)
    return TrainingStep(
        model=model.to(device), batch=(images.to(device), labels.to(device)), loss=_loss,
        summary=f"ResNet widths {WIDTHS}, batch {batch_size} x 3x{IMAGE_SIZE}x{IMAGE_SIZE}",
    )  # fmt: skip
