"""Small statistics helpers used by the evaluation scripts."""

import math
from dataclasses import dataclass


@dataclass
class Summary:
    count: int
    mean: float
    stdev: float


def mean(values):
    """Arithmetic mean; raises on an empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def stdev(values):
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


class Recorder:
    def __init__(self):
        self.values = []

    def add(self, value):
        self.values.append(float(value))

    def summary(self):
        return Summary(len(self.values), mean(self.values), stdev(self.values))


if __name__ == "__main__":
    r = Recorder()
    for x in [1, 2, 3, 4]:
        r.add(x)
    print(r.summary())
