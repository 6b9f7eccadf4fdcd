-- A small mix of what interpreters spend their time on: calls, tables,
-- strings (interning), closures and garbage.
local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end

local function tree(depth)
  if depth == 0 then return {} end
  return { left = tree(depth - 1), right = tree(depth - 1) }
end
local function check(t) if not t.left then return 1 end return 1 + check(t.left) + check(t.right) end

local function strings(n)
  local t = {}
  for i = 1, n do t[#t + 1] = "key" .. (i % 1000) .. ":" .. i end
  local count = 0
  for _, s in ipairs(t) do if s:find(":1") then count = count + 1 end end
  return count
end

local function tables(n)
  local t = {}
  for i = 1, n do t[i] = { x = i, y = i * 2, name = "p" .. (i % 97) } end
  local sum = 0
  for _, p in ipairs(t) do sum = sum + p.x * p.y end
  return sum
end

local scale = tonumber(arg and arg[1]) or 1
print(fib(24 + scale))
for _ = 1, 4 * scale do print(check(tree(14))) end
print(strings(200000 * scale))
print(tables(200000 * scale))
