# What benches/realprogs.sh runs dash on: 300 rounds of a command
# substitution and a subshell, each a child dash forks and that runs the
# commands in it itself (no exec).
i=0
total=0
while [ $i -lt 300 ]; do
    x=$(echo $((i * 3)))
    ( y=$((x + 1)); echo $y > /dev/null )
    total=$((total + x))
    i=$((i + 1))
done
echo $total
