{{/*
stakater/Reloader's values, read by this chart.

A platform team migrating from stakater/Reloader brings its values file (the `reloader.*` tree of
Reloader's chart 2.x). Every template starts with `include "reloader.compat" .`, which translates
those keys onto this chart's own, in place, once per render (idempotent: a template rendered
after another finds the work done). The rule for each key: a value equal to Reloader's default
carries no intent and is left alone, so Reloader's complete default values file installs this
chart's defaults; any other value is mapped to this chart's key, and listed in NOTES.txt with
its new name. A key this operator cannot honour fails the install with a message naming it.

Why in place and not a second values object: every template keeps reading `.Values`, so the
translation lives in one file and no template needs to know it exists.
*/}}
{{- define "reloader.compat" -}}
{{- $V := .Values }}
{{- if not (hasKey $V "__compat") }}
{{- $moved := list }}
{{- $ignored := list }}
{{- $r := $V.reloader }}
{{- $d := $r.deployment | default dict }}
{{- $global := $V.global | default dict }}
{{- $watchGlobally := ne (toString (dig "watchGlobally" true $r)) "false" }}

{{- /* Keys that cannot be honoured: fail, naming the key and what to do instead. */}}
{{- if $r.enablePProf }}
{{- fail "reloader.enablePProf: this operator has no pprof endpoint (it is not a Go program); remove the key. For memory and CPU figures use /metrics (process_*) and docs/operations.md" }}
{{- end }}
{{- if dig "legacy" "rbac" false $r }}
{{- fail "reloader.legacy.rbac: rbac.authorization.k8s.io/v1beta1 is not served by Kubernetes >= 1.22; remove the key (this chart renders rbac.authorization.k8s.io/v1)" }}
{{- end }}
{{- range $key := list "gomaxprocsOverride" "gomemlimitOverride" }}
{{- if get $d $key }}
{{- fail (printf "reloader.deployment.%s: a Go runtime setting; this operator is not a Go program, remove the key (size the pod with resources.limits; see docs/operations.md)" $key) }}
{{- end }}
{{- end }}
{{- if and $r.ignoreSecrets $r.ignoreConfigMaps }}
{{- fail "reloader.ignoreSecrets and reloader.ignoreConfigMaps are both true: nothing would be watched; keep one" }}
{{- end }}
{{- if and $watchGlobally $r.namespaces }}
{{- fail "reloader.namespaces is set but reloader.watchGlobally is true; set reloader.watchGlobally=false to use scoped namespace mode (or use watchNamespaces with rbac.scope)" }}
{{- end }}
{{- $image := $V.image }}
{{- $registry := $global.imageRegistry | default "" }}
{{- if and $image.digest (or (contains "stakater/reloader" (toString $image.repository)) (eq (toString $image.name) "stakater/reloader")) }}
{{- fail (printf "image.digest: %s is a digest of stakater/Reloader's image; remove image.digest (or give this chart's image's digest with its repository)" $image.digest) }}
{{- end }}
{{- /* Reloader's default image, with its default tag, is Reloader's default: this chart's image. */}}
{{- if and (eq (toString $image.repository) "ghcr.io/stakater/reloader") (has (toString $image.tag) (list "v1.4.21" "" "<nil>")) }}
{{- $_ := set $image "repository" "ghcr.io/reloader-rs/reloader" }}
{{- $_ := set $image "tag" "" }}
{{- end }}
{{- if eq (toString $image.name) "stakater/reloader" }}{{ $_ := set $image "name" "reloader-rs/reloader" }}{{ end }}
{{- if contains "stakater/reloader" (toString $image.repository) }}
{{- fail (printf "image.repository: %s:%s is stakater/Reloader's image; this chart runs reloader-rs. Remove image.repository and image.tag from your values (or point them at your mirror of ghcr.io/reloader-rs/reloader)" $image.repository (toString $image.tag)) }}
{{- end }}
{{- if $registry }}
{{- $_ := set $image "registry" $registry }}
{{- $moved = append $moved "global.imageRegistry → image.registry" }}
{{- end }}
{{- with $global.imagePullSecrets }}
{{- $secrets := list }}
{{- range . }}{{ $secrets = append $secrets (ternary (dict "name" .) . (kindIs "string" .)) }}{{ end }}
{{- $_ := set $V "imagePullSecrets" $secrets }}
{{- $moved = append $moved "global.imagePullSecrets → imagePullSecrets" }}
{{- end }}

{{- /* Operator settings under `reloader`. */}}
{{- if eq (toString $r.reloadStrategy) "default" }}{{ $_ := set $r "reloadStrategy" "" }}{{ end }}
{{- if not (has (toString $r.logFormat) (list "json" "plain")) }}{{ $_ := set $r "logFormat" "" }}{{ end }}
{{- range $from, $to := dict "isArgoRollouts" "argoRollouts" "isOpenshift" "deploymentConfigs" "enableCSIIntegration" "csiIntegration" "enableMetricsByNamespace" "metricsCountByNamespace" }}
{{- if eq (toString (get $r $from)) "true" }}
{{- $_ := set $r $to true }}
{{- $moved = append $moved (printf "reloader.%s → reloader.%s" $from $to) }}
{{- end }}
{{- end }}
{{- if $r.ignoreSecrets }}
{{- $_ := set $r "resourcesToIgnore" "secrets" }}
{{- $moved = append $moved "reloader.ignoreSecrets → reloader.resourcesToIgnore: secrets" }}
{{- end }}
{{- if $r.ignoreConfigMaps }}
{{- $_ := set $r "resourcesToIgnore" "configmaps" }}
{{- $moved = append $moved "reloader.ignoreConfigMaps → reloader.resourcesToIgnore: configmaps" }}
{{- end }}
{{- range $from, $kind := dict "ignoreJobs" "jobs" "ignoreCronJobs" "cronjobs" }}
{{- if get $r $from }}
{{- $_ := set $r "ignoredWorkloadTypes" (append ($r.ignoredWorkloadTypes | default list) $kind | uniq) }}
{{- $moved = append $moved (printf "reloader.%s → reloader.ignoredWorkloadTypes: [%s]" $from $kind) }}
{{- end }}
{{- end }}
{{- with $r.ignoreNamespaces }}
{{- if $watchGlobally }}
{{- $list := list }}
{{- range splitList "," (toString .) }}{{ with trim . }}{{ $list = append $list . }}{{ end }}{{ end }}
{{- $_ := set $r "namespacesToIgnore" (concat ($r.namespacesToIgnore | default list) $list | uniq) }}
{{- $moved = append $moved "reloader.ignoreNamespaces → reloader.namespacesToIgnore (a list)" }}
{{- else }}
{{- $ignored = append $ignored "reloader.ignoreNamespaces (as in Reloader, only used with watchGlobally)" }}
{{- end }}
{{- end }}
{{- if not $watchGlobally }}
{{- $_ := set $V.rbac "scope" "namespace" }}
{{- $namespaces := $r.namespaces | default list }}
{{- if kindIs "string" $namespaces }}{{ $namespaces = splitList "," $namespaces }}{{ end }}
{{- $clean := list }}
{{- range $namespaces }}{{ with trim (toString .) }}{{ $clean = append $clean . }}{{ end }}{{ end }}
{{- if $clean }}
{{- /* As Reloader: the release namespace is always watched too. */}}
{{- $_ := set $V "watchNamespaces" (concat (list $.Release.Namespace) $clean | uniq | sortAlpha) }}
{{- $moved = append $moved "reloader.watchGlobally: false, reloader.namespaces → rbac.scope: namespace, watchNamespaces" }}
{{- else }}
{{- $moved = append $moved "reloader.watchGlobally: false → rbac.scope: namespace" }}
{{- end }}
{{- if $r.namespaceSelector }}
{{- /* Reloader drops the selector in scoped mode. */}}
{{- $_ := set $r "namespaceSelector" "" }}
{{- $ignored = append $ignored "reloader.namespaceSelector (as in Reloader, only used with watchGlobally)" }}
{{- end }}
{{- end }}
{{- if $r.enableHA }}
{{- $_ := set $V.ha "enabled" true }}
{{- if hasKey $d "replicas" }}{{ $_ := set $V.ha "replicas" (int $d.replicas) }}{{ end }}
{{- $moved = append $moved "reloader.enableHA, reloader.deployment.replicas → ha.enabled, ha.replicas" }}
{{- else if gt (int (dig "replicas" 1 $d)) 1 }}
{{- /* As Reloader: without HA one replica, whatever the count says. */}}
{{- $ignored = append $ignored "reloader.deployment.replicas (as in Reloader, more than 1 needs reloader.enableHA)" }}
{{- end }}
{{- with $r.leaderElection }}
{{- with .leaseDuration }}{{ $_ := set $V.ha "leaseDuration" . }}{{ $moved = append $moved "reloader.leaderElection.leaseDuration → ha.leaseDuration" }}{{ end }}
{{- with .renewDeadline }}{{ $_ := set $V.ha "renewDeadline" . }}{{ $moved = append $moved "reloader.leaderElection.renewDeadline → ha.renewDeadline" }}{{ end }}
{{- with .retryPeriod }}{{ $ignored = append $ignored "reloader.leaderElection.retryPeriod (standbys watch the Lease and need no retry period)" }}{{ end }}
{{- end }}
{{- if $r.readOnlyRootFileSystem }}
{{- $_ := set $V.securityContext "readOnlyRootFilesystem" true }}
{{- end }}
{{- with $r.matchLabels }}
{{- $_ := set $V "extraSelectorLabels" (merge (deepCopy .) ($V.extraSelectorLabels | default dict)) }}
{{- $moved = append $moved "reloader.matchLabels → extraSelectorLabels" }}
{{- end }}
{{- with $r.custom_annotations }}
{{- $names := dict "configmap" "configmap" "secret" "secret" "auto" "auto" "secret_auto" "secretAuto" "configmap_auto" "configmapAuto" "search" "search" "match" "match" "ignore" "ignore" "pausePeriod" "pausePeriod" "pauseTime" "pauseTime" }}
{{- range $from, $value := . }}
{{- if not (hasKey $names $from) }}
{{- fail (printf "reloader.custom_annotations.%s: not an annotation Reloader or this chart knows (one of %s)" $from (keys $names | sortAlpha | join ", ")) }}
{{- end }}
{{- if $value }}{{ $_ := set $r.customAnnotations (get $names $from) $value }}{{ end }}
{{- end }}
{{- $moved = append $moved "reloader.custom_annotations → reloader.customAnnotations" }}
{{- end }}

{{- /* The pod: reloader.deployment.*. */}}
{{- range $from, $to := dict "nodeSelector" "nodeSelector" "affinity" "affinity" "tolerations" "tolerations" "topologySpreadConstraints" "topologySpreadConstraints" "priorityClassName" "priorityClassName" "runtimeClassName" "runtimeClassName" "schedulerName" "schedulerName" "dnsConfig" "dnsConfig" "volumes" "extraVolumes" "volumeMounts" "extraVolumeMounts" "annotations" "deploymentAnnotations" "resources" "resources" }}
{{- with get $d $from }}
{{- $_ := set $V $to . }}
{{- $moved = append $moved (printf "reloader.deployment.%s → %s" $from $to) }}
{{- end }}
{{- end }}
{{- if hasKey $d "revisionHistoryLimit" }}{{ $_ := set $V "revisionHistoryLimit" (int $d.revisionHistoryLimit) }}{{ end }}
{{- if kindIs "bool" $d.hostUsers }}{{ $_ := set $V "hostUsers" $d.hostUsers }}{{ end }}
{{- if hasKey $d "automountServiceAccountToken" }}{{ $_ := set $V "automountServiceAccountToken" $d.automountServiceAccountToken }}{{ end }}
{{- with dig "pod" "annotations" dict $d }}
{{- $_ := set $V "podAnnotations" (merge (deepCopy .) $V.podAnnotations) }}
{{- $moved = append $moved "reloader.deployment.pod.annotations → podAnnotations" }}
{{- end }}
{{- $reloaderLabels := dict "provider" "stakater" "group" "com.stakater.platform" "version" "v1.4.21" }}
{{- with $d.labels }}
{{- if ne (toJson .) (toJson $reloaderLabels) }}
{{- $_ := set $V "podLabels" (merge (deepCopy .) $V.podLabels) }}
{{- $_ := set $V "deploymentLabels" (merge (deepCopy .) ($V.deploymentLabels | default dict)) }}
{{- $moved = append $moved "reloader.deployment.labels → deploymentLabels, podLabels" }}
{{- end }}
{{- end }}
{{- $reloaderPodSecurity := dict "runAsNonRoot" true "runAsUser" 65534 "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- with $d.securityContext }}
{{- if ne (toJson .) (toJson $reloaderPodSecurity) }}
{{- $_ := set $V "podSecurityContext" (mergeOverwrite (deepCopy $V.podSecurityContext) .) }}
{{- $moved = append $moved "reloader.deployment.securityContext → podSecurityContext (merged over this chart's)" }}
{{- end }}
{{- end }}
{{- with $d.containerSecurityContext }}
{{- $_ := set $V "securityContext" (mergeOverwrite (deepCopy $V.securityContext) .) }}
{{- $moved = append $moved "reloader.deployment.containerSecurityContext → securityContext (merged over this chart's)" }}
{{- end }}
{{- range $probe := list "livenessProbe" "readinessProbe" }}
{{- with get $d $probe }}
{{- /* Timings only: this chart's probes keep their own paths (/live, /readyz). */}}
{{- $_ := set $V $probe (mergeOverwrite (deepCopy (get $V $probe)) (omit . "httpGet" "exec" "tcpSocket" "grpc")) }}
{{- $moved = append $moved (printf "reloader.deployment.%s → %s (timings)" $probe $probe) }}
{{- end }}
{{- end }}
{{- with $d.env }}
{{- $env := dict "open" (.open | default dict) "secret" (.secret | default dict) "field" (.field | default dict) "existing" (.existing | default dict) }}
{{- if or $env.open $env.secret $env.field $env.existing }}
{{- $_ := set $V "reloaderEnv" $env }}
{{- $moved = append $moved "reloader.deployment.env.{open,secret,field,existing} → extraEnv (env.secret values in a Secret, as Reloader)" }}
{{- end }}
{{- end }}

{{- /* Objects next to the Deployment. */}}
{{- with $r.service }}
{{- $_ := set $V.service "enabled" true }}
{{- range $key := list "port" "annotations" "labels" "ipFamilyPolicy" "ipFamilies" }}
{{- with get $r.service $key }}{{ $_ := set $V.service $key . }}{{ end }}
{{- end }}
{{- $moved = append $moved "reloader.service → service" }}
{{- end }}
{{- with $r.rbac }}
{{- if eq (toString .enabled) "false" }}{{ $_ := set $V.rbac "create" false }}{{ $moved = append $moved "reloader.rbac.enabled → rbac.create" }}{{ end }}
{{- with .labels }}{{ $_ := set $V.rbac "labels" . }}{{ $moved = append $moved "reloader.rbac.labels → rbac.labels" }}{{ end }}
{{- end }}
{{- with $r.serviceAccount }}
{{- if eq (toString .create) "false" }}{{ $_ := set $V.serviceAccount "create" false }}{{ $moved = append $moved "reloader.serviceAccount.create → serviceAccount.create" }}{{ end }}
{{- range $key := list "name" "labels" "annotations" }}
{{- with get $r.serviceAccount $key }}{{ $_ := set $V.serviceAccount $key . }}{{ $moved = append $moved (printf "reloader.serviceAccount.%s → serviceAccount.%s" $key $key) }}{{ end }}
{{- end }}
{{- end }}
{{- range $monitor := list "serviceMonitor" "podMonitor" }}
{{- $m := get $r $monitor | default dict }}
{{- if $m.enabled }}
{{- $ours := get $V $monitor }}
{{- $_ := set $ours "enabled" true }}
{{- range $key := list "namespace" "interval" "scheme" "tlsConfig" "bearerTokenFile" "bearerTokenSecret" "labels" "annotations" "metricRelabelings" "relabelings" "targetLabels" "podTargetLabels" }}
{{- with get $m $key }}{{ $_ := set $ours $key . }}{{ end }}
{{- end }}
{{- with $m.timeout }}{{ $_ := set $ours "scrapeTimeout" . }}{{ end }}
{{- if hasKey $m "honorLabels" }}{{ $_ := set $ours "honorLabels" $m.honorLabels }}{{ end }}
{{- $moved = append $moved (printf "reloader.%s → %s" $monitor $monitor) }}
{{- end }}
{{- end }}
{{- with $r.podDisruptionBudget }}
{{- if .enabled }}
{{- $_ := set $V.podDisruptionBudget "enabled" true }}
{{- with .minAvailable }}{{ $_ := set $V.podDisruptionBudget "minAvailable" . }}{{ end }}
{{- with .maxUnavailable }}{{ $_ := set $V.podDisruptionBudget "maxUnavailable" . }}{{ end }}
{{- $moved = append $moved "reloader.podDisruptionBudget → podDisruptionBudget" }}
{{- end }}
{{- end }}
{{- with $r.netpol }}
{{- if .enabled }}
{{- $_ := set $V.networkPolicy "enabled" true }}
{{- with .from }}{{ $_ := set $V.networkPolicy "metricsFrom" . }}{{ end }}
{{- with .to }}
{{- /* As Reloader: egress to these peers on 443 (the API server). */}}
{{- $_ := set $V.networkPolicy "egress" (list (dict "ports" (list (dict "port" 443 "protocol" "TCP")) "to" .)) }}
{{- end }}
{{- $moved = append $moved "reloader.netpol → networkPolicy (from → metricsFrom, to → egress)" }}
{{- end }}
{{- end }}
{{- with $r.verticalPodAutoscaler }}
{{- if .enabled }}
{{- $_ := set $V "verticalPodAutoscaler" (deepCopy .) }}
{{- $moved = append $moved "reloader.verticalPodAutoscaler → verticalPodAutoscaler" }}
{{- end }}
{{- end }}
{{- /* Keys Reloader's chart accepts that change nothing here. */}}
{{- with $r.serviceAccount }}
{{- if hasKey . "automountServiceAccountToken" }}
{{- $ignored = append $ignored "reloader.serviceAccount.automountServiceAccountToken (the pod's own setting decides: automountServiceAccountToken, from reloader.deployment.automountServiceAccountToken)" }}
{{- end }}
{{- end }}
{{- if and $r.pprofAddr (ne (toString $r.pprofAddr) ":6060") }}
{{- $ignored = append $ignored "reloader.pprofAddr (as in Reloader, only used with enablePProf, which this operator has not)" }}
{{- end }}
{{- with $V.kubernetes }}
{{- if and .host (ne (toString .host) "https://kubernetes.default") }}
{{- $ignored = append $ignored "kubernetes.host (Reloader's chart reads it nowhere; the operator uses the in-cluster API server address)" }}
{{- end }}
{{- end }}
{{- with $V.namespace }}
{{- if ne (toString .) $.Release.Namespace }}
{{- fail (printf "namespace: %s is not the release namespace %s; this chart installs into the release namespace, so install with --namespace %s and remove the key" . $.Release.Namespace .) }}
{{- end }}
{{- end }}
{{- if and $r.webhookUrl (hasKey $r "custom_annotations") (not $r.custom_annotations) }}
{{- $moved = append $moved "reloader.webhookUrl: stakater/Reloader's chart passed it only when reloader.custom_annotations was set; here it always applies (reloads are POSTed to it, workloads are not changed)" }}
{{- end }}

{{- /*
Names. A release installed from Reloader's chart has `<release>-reloader` objects whose pods are
selected by `app`/`release` and serve metrics on a port named `http`; scrape jobs, ServiceMonitor
selections and dashboards key on them, and a Deployment's selector cannot change. So: the release
keeps Reloader's names when its Deployment (found by `lookup` during `helm upgrade`) has
Reloader's selector, this chart's names when it has this chart's, and otherwise (a first install,
`helm template`) Reloader's names when Reloader's values are given.
*/}}
{{- $naming := toString ($V.naming | default "") }}
{{- if not (has $naming (list "" "chart" "reloader")) }}
{{- fail (printf "naming must be chart, reloader or empty, not %q" $naming) }}
{{- end }}
{{- $why := "" }}
{{- if eq $naming "" }}
{{- $name := default $.Chart.Name $V.nameOverride }}
{{- $theirs := printf "%s-%s" $.Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- $ours := ternary ($.Release.Name | trunc 63 | trimSuffix "-") $theirs (contains $name $.Release.Name) }}
{{- if $V.fullnameOverride }}{{ $theirs = $V.fullnameOverride | trunc 63 | trimSuffix "-" }}{{ $ours = $theirs }}{{ end }}
{{- range $candidate := list $theirs $ours }}
{{- if not $naming }}
{{- $live := lookup "apps/v1" "Deployment" $.Release.Namespace $candidate }}
{{- if eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $live) $.Release.Name }}
{{- $selector := dig "spec" "selector" "matchLabels" dict $live }}
{{- if eq (toString (get $selector "app")) $candidate }}
{{- $naming = "reloader" }}{{ $why = printf "the Deployment %s has Reloader's selector" $candidate }}
{{- else if hasKey $selector "app.kubernetes.io/instance" }}
{{- $naming = "chart" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $naming }}
{{- $reloaderKeys := list "isArgoRollouts" "isOpenshift" "ignoreSecrets" "ignoreConfigMaps" "ignoreJobs" "ignoreCronJobs" "ignoreNamespaces" "watchGlobally" "namespaces" "enableHA" "leaderElection" "enablePProf" "enableCSIIntegration" "pprofAddr" "readOnlyRootFileSystem" "legacy" "matchLabels" "enableMetricsByNamespace" "deployment" "service" "rbac" "serviceAccount" "custom_annotations" "serviceMonitor" "podMonitor" "podDisruptionBudget" "netpol" "verticalPodAutoscaler" }}
{{- range $reloaderKeys }}
{{- if and (not $naming) (hasKey $r .) }}{{ $naming = "reloader" }}{{ $why = printf "Reloader's values are given: reloader.%s" . }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $naming = $naming | default "chart" }}
{{- $_ := set $V "__compat" (dict "moved" $moved "ignored" $ignored "naming" $naming "namingWhy" $why) }}
{{- end }}
{{- end }}
