"""Writes a YAML document of N items (maps, flow lists, block scalars) to
standard output: what yaml-cpp's parse tool reads in benches/realprogs.sh."""
import random
import sys

random.seed(1)
for i in range(int(sys.argv[1])):
    print(f'item{i}:\n  name: "widget number {i}"\n  price: {random.random() * 100:.2f}')
    print(f"  tags: [alpha, beta, gamma{i % 7}]\n  dims:\n    - {{w: {i % 13}, h: {i % 17}, d: {i % 19}}}")
    print(f"    - {{w: 1, h: 2, d: 3}}\n  notes: |\n    line one of {i}\n    line two")
