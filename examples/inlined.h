/* Helpers a header gives its includers, inlined where they are called. */

static inline unsigned read32(const unsigned char *p)
{
    unsigned v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

static inline unsigned count_equal(const unsigned char *a, const unsigned char *b, const unsigned char *end)
{
    const unsigned char *start = a;
    while (a < end && *a == *b) {
        a++;
        b++;
    }
    return (unsigned)(a - start);
}
