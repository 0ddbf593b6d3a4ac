{{/* Chart name, overridable. */}}
{{- define "reloader.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every resource name. The release name alone when it already contains the chart name,
so `helm install reloader` gives `reloader`, not `reloader-reloader`. With stakater/Reloader's
names (see "reloader.reloaderNames"): always `<release>-<name>`, as its chart does.
*/}}
{{- define "reloader.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if and (contains $name .Release.Name) (not (include "reloader.reloaderNames" .)) }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Non-empty when the release keeps stakater/Reloader's chart's names, labels and port name
(`naming: reloader`, or decided by "reloader.compat" from the values and the cluster).
*/}}
{{- define "reloader.reloaderNames" -}}
{{- $compat := .Values.__compat | default dict }}
{{- if eq (toString ($compat.naming | default .Values.naming)) "reloader" }}true{{ end }}
{{- end }}

{{/* Name of the metrics port (container and Service): Reloader's `http`, or `metrics`. */}}
{{- define "reloader.metricsPortName" -}}
{{- if include "reloader.reloaderNames" . }}http{{ else }}metrics{{ end }}
{{- end }}

{{/* The operator's container name: Reloader's chart names it as the Deployment. */}}
{{- define "reloader.containerName" -}}
{{- if include "reloader.reloaderNames" . }}{{ include "reloader.fullname" . }}{{ else }}reloader{{ end }}
{{- end }}

{{/* Names of the workload (Cluster)Role and its binding: Reloader's `-role`/`-role-binding`. */}}
{{- define "reloader.roleName" -}}
{{ include "reloader.fullname" . }}{{ if include "reloader.reloaderNames" . }}-role{{ end }}
{{- end }}

{{- define "reloader.roleBindingName" -}}
{{ include "reloader.fullname" . }}{{ if include "reloader.reloaderNames" . }}-role-binding{{ end }}
{{- end }}

{{- define "reloader.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select the operator's pods; never change them (Deployment selectors are immutable).
With Reloader's names they are its chart's selector labels, `app: <fullname>` and
`release: <release>`, so a release installed from it upgrades in place and every
ServiceMonitor, PodMonitor or scrape job selecting them still finds the pods.
*/}}
{{- define "reloader.selectorLabels" -}}
{{- if include "reloader.reloaderNames" . -}}
app: {{ include "reloader.fullname" . }}
release: {{ .Release.Name | quote }}
{{- else -}}
app.kubernetes.io/name: {{ include "reloader.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- with .Values.extraSelectorLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "reloader.labels" -}}
helm.sh/chart: {{ include "reloader.chart" . }}
{{ include "reloader.selectorLabels" . }}
{{- if include "reloader.reloaderNames" . }}
app.kubernetes.io/name: {{ include "reloader.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The chart's labels with a user's on top (`list $ctx $labels`): a user's label wins, so a
monitor's `release: prometheus` (what kube-prometheus-stack selects by) replaces, instead of
duplicating, the `release` label of Reloader's names. For objects nothing selects by these.
*/}}
{{- define "reloader.labelsWith" -}}
{{- $labels := include "reloader.labels" (index . 0) | fromYaml }}
{{- toYaml (mergeOverwrite $labels (index . 1 | default dict)) }}
{{- end }}

{{- define "reloader.rbacLabels" -}}
{{ include "reloader.labels" . }}
{{- with .Values.rbac.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator image: `repository` (or `registry/name`), then `@digest` or `:tag`. */}}
{{- define "reloader.image" -}}
{{- $i := .Values.image }}
{{- $path := $i.repository }}
{{- if $i.registry }}{{ $path = printf "%s/%s" $i.registry $i.name }}{{ end }}
{{- if $i.digest }}
{{- printf "%s@%s" $path $i.digest }}
{{- else }}
{{- printf "%s:%s" $path ($i.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "reloader.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "reloader.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "reloader.replicas" -}}
{{- if .Values.ha.enabled }}{{ int .Values.ha.replicas }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{- define "reloader.leaseName" -}}
{{- default (printf "%s-leader" (include "reloader.fullname" .)) .Values.ha.leaseName }}
{{- end }}

{{- define "reloader.scope" -}}
{{- $scope := .Values.rbac.scope }}
{{- if not (has $scope (list "cluster" "namespace")) }}
{{- fail (printf "rbac.scope must be cluster or namespace, not %q" $scope) }}
{{- end }}
{{- $scope }}
{{- end }}

{{/* The watched namespaces as a JSON list: in namespace scope, never empty. */}}
{{- define "reloader.watchNamespaces" -}}
{{- $namespaces := .Values.watchNamespaces | default list | uniq }}
{{- if and (eq (include "reloader.scope" .) "namespace") (not $namespaces) }}
{{- $namespaces = list .Release.Namespace }}
{{- end }}
{{- toJson $namespaces }}
{{- end }}

{{/* Workload kinds the operator is told to ignore (the user's list, plus DeploymentConfigs unless enabled). */}}
{{- define "reloader.ignoredWorkloadTypes" -}}
{{- $ignored := .Values.reloader.ignoredWorkloadTypes | default list }}
{{- if and (not .Values.reloader.deploymentConfigs) (not (has "deploymentconfigs" $ignored)) }}
{{- $ignored = append $ignored "deploymentconfigs" }}
{{- end }}
{{- toJson $ignored }}
{{- end }}

{{/*
The namespaced rules the operator needs, shared by the ClusterRole (cluster scope) and the
per-namespace Roles (namespace scope). Only what the operator calls: sources are watched
(list/watch); workloads are watched, read before some writes and patched; CronJobs are reloaded
by creating a Job and Jobs by deleting and creating them again.
*/}}
{{- define "reloader.rules" -}}
{{- $ignored := include "reloader.ignoredWorkloadTypes" . | fromJsonArray }}
{{- $r := .Values.reloader }}
{{- if ne $r.resourcesToIgnore "configmaps" }}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list, watch]
{{- end }}
{{- if ne $r.resourcesToIgnore "secrets" }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [list, watch]
{{- end }}
{{- $apps := list }}
{{- range list "deployments" "daemonsets" "statefulsets" }}
{{- if not (has . $ignored) }}{{ $apps = append $apps . }}{{ end }}
{{- end }}
{{- if $apps }}
- apiGroups: [apps]
  resources: {{ toJson $apps }}
  verbs: [get, list, watch, patch]
{{- end }}
{{- if not (has "cronjobs" $ignored) }}
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if not (has "jobs" $ignored) }}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, patch, create, delete]
{{- else if not (has "cronjobs" $ignored) }}
{{- /* CronJob reloads create a Job, and read it back when a retry finds it already there. */}}
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create]
{{- end }}
{{- if and $r.argoRollouts (not (has "rollouts" $ignored)) }}
- apiGroups: [argoproj.io]
  resources: [rollouts]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if not (has "deploymentconfigs" $ignored) }}
- apiGroups: [apps.openshift.io]
  resources: [deploymentconfigs]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if $r.csiIntegration }}
- apiGroups: [secrets-store.csi.x-k8s.io]
  resources: [secretproviderclasspodstatuses]
  verbs: [list, watch]
{{- end }}
{{- if .Values.evict.enabled }}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- end }}
- apiGroups: [reloader.rs]
  resources: [reloadpolicies]
  verbs: [get, list, watch]
- apiGroups: [reloader.rs]
  resources: [reloadpolicies/status]
  verbs: [patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* The webhook's Service, Secret and configuration names. */}}
{{- define "reloader.webhookService" -}}
{{ include "reloader.fullname" . }}-webhook
{{- end }}

{{- define "reloader.hashKeySecret" -}}
{{ .Values.reloader.hashKeySecret | default (printf "%s-hash-key" (include "reloader.fullname" .)) }}
{{- end }}

{{- define "reloader.webhookSecret" -}}
{{ .Values.webhook.secretName | default (printf "%s-webhook-tls" (include "reloader.fullname" .)) }}
{{- end }}

{{- define "reloader.webhookConfiguration" -}}
{{ .Values.webhook.configurationName | default (include "reloader.fullname" .) }}
{{- end }}
