#!/usr/bin/env bash
# Writes the database benchmark's SQL: 100 000 inserts in one transaction,
# then a hundred grouped queries, a GROUP BY and a LIKE scan.
echo "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, value REAL, grp INTEGER);"
echo "BEGIN;"
awk 'BEGIN { for (i = 0; i < 100000; i++) printf "INSERT INTO t(name, value, grp) VALUES('"'"'name%d'"'"', %.1f, %d);\n", i % 5000, i / 2, i % 100 }'
echo "COMMIT;"
echo "CREATE INDEX t_grp ON t(grp);"
for g in $(seq 0 99); do echo "SELECT count(*), sum(value) FROM t WHERE grp = $g;"; done
echo "SELECT name, count(*) FROM t GROUP BY name ORDER BY 2 DESC LIMIT 5;"
echo "SELECT avg(value) FROM t WHERE name LIKE 'name1%';"
