# Helpers the benchmark scripts share; sourced, not run.

# The median of the numbers on standard input, one a line.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Downloads URL ($1), checks it against its SHA-256 ($2) and unpacks it
# into directory $3: nothing unchecked is built.
fetch_checked() {
    local file
    file=$(mktemp)
    curl -fsSL "$1" -o "$file" || { rm -f "$file"; echo "cannot download $1" >&2; return 1; }
    echo "$2  $file" | sha256sum -c --quiet - || { rm -f "$file"; echo "$1 is not the file expected (SHA-256 differs)" >&2; return 1; }
    tar xf "$file" -C "$3"
    rm -f "$file"
}
