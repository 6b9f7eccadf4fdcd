# What a Python program spends its time on: calls, small objects made and
# freed, attributes, dictionaries keyed by strings, sorting.
import sys


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Point:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y

    def add(self, other):
        return Point(self.x + other.x, self.y + other.y)


def points(n):
    p = Point(0, 0)
    for i in range(n):
        p = p.add(Point(i, -i))
    return p.x


def words(n):
    counts = {}
    for i in range(n):
        word = "w%d" % (i % 997)
        counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]


def main(scale):
    print(fib(22 + scale), points(200000 * scale), words(300000 * scale))


main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
