-- Argo CD health check for ReloadPolicy (reloader.rs/v1alpha1).
-- Install it under `resource.customizations.health.reloader.rs_ReloadPolicy` in the argocd-cm
-- ConfigMap (docs/gitops.md shows how). tests/gitops_health.rs runs it in gopher-lua, the
-- interpreter Argo CD embeds, against statuses the operator wrote.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }
if obj.status == nil or obj.status.conditions == nil then
  return hs
end

local function find(type)
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

-- A condition written for an older generation says nothing about this spec.
local function current(c)
  if c == nil then
    return false
  end
  local generation = obj.metadata.generation
  return generation == nil or c.observedGeneration == nil or c.observedGeneration >= generation
end

local ready, stalled, reconciling = find("Ready"), find("Stalled"), find("Reconciling")
if not current(ready) then
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
if current(stalled) and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end
if ready.status == "False" then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. ready.message
  return hs
end
if current(reconciling) and reconciling.status == "True" then
  hs.message = reconciling.reason .. ": " .. reconciling.message
  return hs
end
if ready.status == "True" then
  if ready.reason == "Suspended" then
    hs.status = "Suspended"
  else
    hs.status = "Healthy"
  end
  hs.message = ready.message
  return hs
end
hs.message = ready.reason .. ": " .. ready.message
return hs
