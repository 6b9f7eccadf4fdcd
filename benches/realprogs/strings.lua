-- A short run of Lua's string table and table lookups: 3,000 keys made
-- and looked up. Small enough for regions timed by uprobes on lines.
local t = {}
for i = 1, 3000 do t["k" .. i] = i; t[i] = ("x"):rep(i % 7) end
local s = 0
for i = 1, 3000 do s = s + (t["k" .. i] or 0) end
print(s)
