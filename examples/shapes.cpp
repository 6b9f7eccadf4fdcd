// C++: namespaces, classes, templates, virtual calls and an exception that
// leaves a function through two instrumented frames.
//
// Usage: shapes [N]   default 100. Each of N rounds computes the area of a
// circle and a square, sums a vector through a template, and every tenth
// round validate() throws from inside check(), caught in main().
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace shapes {

class Shape {
public:
    virtual ~Shape() = default;
    virtual double area() const = 0;
};

class Circle : public Shape {
public:
    explicit Circle(double r) : r_(r) {}
    double area() const override;

private:
    double r_;
};

class Square : public Shape {
public:
    explicit Square(double s) : s_(s) {}
    double area() const override;

private:
    double s_;
};

__attribute__((noinline)) double Circle::area() const { return 3.14159 * r_ * r_; }
__attribute__((noinline)) double Square::area() const { return s_ * s_; }

template <typename T>
__attribute__((noinline)) T sum(const std::vector<T> &values)
{
    T total = 0;
    for (const T &v : values)
        total += v;
    return total;
}

} // namespace shapes

namespace checks {

__attribute__((noinline)) void check(int round)
{
    if (round % 10 == 9)
        throw std::runtime_error("round rejected");
}

__attribute__((noinline)) int validate(int round)
{
    check(round);
    return round;
}

} // namespace checks

int main(int argc, char **argv)
{
    int n = argc > 1 ? std::atoi(argv[1]) : 100;
    double total = 0;
    int rejected = 0;
    std::vector<int> ints{1, 2, 3};
    for (int i = 0; i < n; i++) {
        shapes::Circle c(i);
        shapes::Square s(i);
        const shapes::Shape *both[] = {&c, &s};
        for (const shapes::Shape *shape : both)
            total += shape->area();
        total += shapes::sum(ints) + shapes::sum(std::vector<double>{0.5});
        try {
            checks::validate(i);
        } catch (const std::runtime_error &) {
            rejected++;
        }
    }
    std::printf("total=%.1f rejected=%d\n", total, rejected);
    return 0;
}
