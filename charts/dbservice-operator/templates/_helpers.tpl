{{/* Chart name. */}}
{{- define "dbservice-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: prefix of every resource. With release name "dbservice-operator" this is
"dbservice-operator", which matches the operator's built-in defaults.
*/}}
{{- define "dbservice-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dbservice-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "dbservice-operator.labels" -}}
helm.sh/chart: {{ include "dbservice-operator.chart" . }}
{{ include "dbservice-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dbservice-operator
{{- end }}

{{/* Selector labels (immutable: used by the Deployment selector). */}}
{{- define "dbservice-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dbservice-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "dbservice-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dbservice-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Service in front of the webhook (443 -> 9443) and metrics (8080). */}}
{{- define "dbservice-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "dbservice-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Names of the ValidatingWebhookConfiguration and MutatingWebhookConfiguration. */}}
{{- define "dbservice-operator.validatingWebhookName" -}}
{{- include "dbservice-operator.fullname" . }}
{{- end }}
{{- define "dbservice-operator.mutatingWebhookName" -}}
{{- include "dbservice-operator.fullname" . }}
{{- end }}

{{- define "dbservice-operator.leaseName" -}}
{{- default (printf "%s-leader" (include "dbservice-operator.fullname" .)) .Values.operator.leaseName }}
{{- end }}

{{/* cert-manager Certificate / Issuer names. */}}
{{- define "dbservice-operator.certificateName" -}}
{{- printf "%s-webhook" (include "dbservice-operator.fullname" .) }}
{{- end }}
{{- define "dbservice-operator.issuerName" -}}
{{- printf "%s-selfsigned" (include "dbservice-operator.fullname" .) }}
{{- end }}

{{/*
Name of the Secret holding the serving certificate, per certificates.mode:
  self-managed  -> written by the operator (certificates.selfManaged.secretName)
  cert-manager  -> written by cert-manager (certificates.certManager.secretName)
  secret        -> provided by the user (certificates.secret.name, required)
*/}}
{{- define "dbservice-operator.tlsSecretName" -}}
{{- $mode := .Values.certificates.mode }}
{{- if eq $mode "self-managed" }}
{{- default (printf "%s-webhook-tls" (include "dbservice-operator.fullname" .)) .Values.certificates.selfManaged.secretName }}
{{- else if eq $mode "cert-manager" }}
{{- default (printf "%s-webhook-tls" (include "dbservice-operator.fullname" .)) .Values.certificates.certManager.secretName }}
{{- else if eq $mode "secret" }}
{{- required "certificates.secret.name is required when certificates.mode=secret" .Values.certificates.secret.name }}
{{- else }}
{{- fail (printf "certificates.mode must be one of self-managed, cert-manager, secret (got %q)" $mode) }}
{{- end }}
{{- end }}

{{/* "true" when the webhooks point at an external URL (operator outside the cluster). */}}
{{- define "dbservice-operator.urlMode" -}}
{{- if .Values.webhook.url }}true{{ end }}
{{- end }}

{{/* "true" when the operator manages its own certificates (and patches the caBundle). */}}
{{- define "dbservice-operator.selfManaged" -}}
{{- if and (eq .Values.certificates.mode "self-managed") (not .Values.webhook.url) }}true{{ end }}
{{- end }}

{{/* "true" when cert-manager's cainjector fills the caBundle. */}}
{{- define "dbservice-operator.certManager" -}}
{{- if and (eq .Values.certificates.mode "cert-manager") (not .Values.webhook.url) }}true{{ end }}
{{- end }}

{{/*
Static caBundle for the webhook configurations (empty when the operator or cert-manager fills it):
  URL mode     -> webhook.caBundle, else certificates.secret.caBundle (required)
  secret mode  -> certificates.secret.caBundle (required)
*/}}
{{- define "dbservice-operator.staticCABundle" -}}
{{- if .Values.webhook.url }}
{{- required "webhook.caBundle (or certificates.secret.caBundle) is required when webhook.url is set" (default .Values.certificates.secret.caBundle .Values.webhook.caBundle) }}
{{- else if eq .Values.certificates.mode "secret" }}
{{- required "certificates.secret.caBundle is required when certificates.mode=secret" .Values.certificates.secret.caBundle }}
{{- end }}
{{- end }}

{{/*
caBundle to render for one webhook. Arguments: (dict "ctx" $ "kind" "ValidatingWebhookConfiguration"
"config" <configuration name> "webhook" <webhook name>).
In self-managed mode the operator patches the caBundle into the live object after it has created
its CA (in cert-manager mode cainjector does). To never wipe that value on `helm upgrade`
(including --force, which replaces the object), the live caBundle is looked up and rendered back.
`lookup` returns nothing under `helm template` / `--dry-run=client`, where the field is simply omitted.
*/}}
{{- define "dbservice-operator.caBundle" -}}
{{- $ctx := .ctx }}
{{- $static := include "dbservice-operator.staticCABundle" $ctx }}
{{- if $static }}
{{- $static }}
{{- else if or (include "dbservice-operator.selfManaged" $ctx) (include "dbservice-operator.certManager" $ctx) }}
{{- $live := lookup "admissionregistration.k8s.io/v1" .kind "" .config }}
{{- if $live }}
{{- range $live.webhooks }}
{{- if and (eq .name $.webhook) .clientConfig .clientConfig.caBundle }}
{{- .clientConfig.caBundle }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* clientConfig of a webhook. Arguments: (dict "ctx" $ "path" "/validate" "caBundle" "...") */}}
{{- define "dbservice-operator.clientConfig" -}}
{{- $ctx := .ctx }}
{{- if $ctx.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" $ctx.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "dbservice-operator.webhookServiceName" $ctx }}
  namespace: {{ $ctx.Release.Namespace }}
  path: {{ .path }}
  port: {{ $ctx.Values.service.port }}
{{- end }}
{{- with .caBundle }}
caBundle: {{ . }}
{{- end }}
{{- end }}

{{/* Common part of both webhooks (rules, selectors, policies). Argument: (dict "ctx" $ "type" "validating"|"mutating") */}}
{{- define "dbservice-operator.webhookCommon" -}}
{{- $ctx := .ctx }}
rules:
  - apiGroups: ["dbservice.dev"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["databaseservices"]
    scope: Namespaced
failurePolicy: {{ $ctx.Values.webhook.failurePolicy }}
matchPolicy: Equivalent
sideEffects: None
timeoutSeconds: {{ $ctx.Values.webhook.timeoutSeconds }}
admissionReviewVersions: ["v1"]
{{- if eq .type "mutating" }}
reinvocationPolicy: Never
{{- end }}
{{- $excluded := list "kube-system" }}
{{- if $ctx.Values.webhook.excludeReleaseNamespace }}
{{- $excluded = append $excluded $ctx.Release.Namespace }}
{{- end }}
{{- $excluded = concat $excluded $ctx.Values.webhook.excludeNamespaces | uniq }}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml $excluded | nindent 8 }}
matchConditions:
  {{- if eq .type "validating" }}
  # A terminating DatabaseService is validated when its spec changes (its agents and the operator
  # would carry the change out while any finalizer holds it); a change of its finalizers, labels
  # or status alone does not call the webhook, so an operator that is down never keeps it from
  # going away.
  - name: live-or-spec-changed
    expression: "!has(object.metadata.deletionTimestamp) || (oldObject != null && object.spec != oldObject.spec)"
  {{- else }}
  # Defaults are for live objects: a terminating one is never mutated.
  - name: not-being-deleted
    expression: "!has(object.metadata.deletionTimestamp)"
  {{- end }}
  {{- with $ctx.Values.webhook.extraMatchConditions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
Rules of the controller (DatabaseServices, their children, events): in the ClusterRole, or in a
Role of operator.watchNamespace. The child rules match CHILD_KINDS in src/operator/caches/mod.rs
(tests/rbac.rs checks it). Children are read from watches (list, watch); this version needs get
only where it must read past its cache (a credentials-Secret create conflict, a ledger append). get
on pods is needed: a primary missing from the cache is read live before its Lease is released. get
on services, statefulsets and PVCs is kept for one release: during a rolling upgrade the old
operator pods, which read children with GET, still run under the new rules.
*/}}
{{- define "dbservice-operator.controllerRules" -}}
# DatabaseServices: watched, finalizer added/removed with patch/update. Never created or deleted.
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservices"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Status (phase, conditions, observedGeneration) through the status subresource.
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservices/status"]
  verbs: ["get", "patch", "update"]
# Needed to set ownerReferences with blockOwnerDeletion=true on children (OwnerReferencesPermissionEnforcement).
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservices/finalizers"]
  verbs: ["update"]
# ConfigMaps NAME-scripts and NAME-ledger (created, appended with update, deleted on deletionPolicy Delete).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# Secrets NAME-credentials and NAME-superuser: created once (metadata watched, never the data);
# get only to tell our Secret from someone else's after a create conflict, to sign with the
# database's CA (NAME-ca) when its server certificate NAME-tls is issued (patch), to read the
# pooler's control token (NAME-pooler), and once per change of NAME-credentials / NAME-superuser
# to rewrite one an older operator wrote (patch: the uri, the replication keys; passwords kept);
# deleted on deletionPolicy Delete.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Services NAME, NAME-replicas, NAME-headless (server-side apply).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# PVCs data-NAME-N (made by the StatefulSet): ownerReference, growth, deletion on deletionPolicy Delete.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# The StatefulSet NAME running PostgreSQL (server-side apply; restarts annotate its pod template;
# delete re-creates one whose immutable fields changed, its pods orphaned and adopted back).
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pods: health feeds status; patch labels each pod dbservice.dev/role=primary|standby (the
# NAME-replicas Service selects standbys by it); delete replaces a pod stuck broken on an old
# revision (a StatefulSet never does, which would block every rollback).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Instance agents (failover): each database gets a ServiceAccount, Role and RoleBinding NAME-instance
# (server-side apply, written with the StatefulSet) and its primary Lease NAME-primary. The operator
# holds every permission it grants (RBAC forbids escalation): get on databaseservices and get/patch on
# pods above, get/update on leases here. The Lease of a pod that is gone is released with update.
# list/watch: the operator watches the primary Leases (managed-by label) to see one lapse (its
# holder fenced itself) and fail over at once; a Lease holds no secret.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "patch", "update"]
# NetworkPolicy NAME for the database's pods (databaseNetworkPolicies.enabled; server-side apply,
# written with the StatefulSet).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
# PodDisruptionBudgets NAME-primary and NAME-standbys (server-side apply, written with the
# StatefulSet): a drain waits for the switchover instead of evicting the primary.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# The pooler (spec.pooler): Deployment NAME-pooler (server-side apply when it differs from the
# built one, read once per pass), its ConfigMap, Secret, Services, ServiceAccount, Role, RoleBinding
# and PodDisruptionBudget. Removing spec.pooler deletes the Deployment, Services, ConfigMap, Secret
# and budget; the account and its Role (a read of the DatabaseService) stay until the DatabaseService
# goes: the operator never deletes Roles. Pods are listed to ask the ready pooler pods to pause
# before a switchover.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["delete"]
# DatabaseServiceBackups: watched; created by the scheduler at the cron times; deleted beyond
# the history limits (their Jobs go with them; the backups in the object store stay).
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservicebackups"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Backup status (phase, backup id, WAL, LSN, times, size) through the status subresource.
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservicebackups/status"]
  verbs: ["get", "patch", "update"]
# Needed to set ownerReferences with blockOwnerDeletion=true on backup Jobs.
- apiGroups: ["dbservice.dev"]
  resources: ["databaseservicebackups/finalizers"]
  verbs: ["update"]
# The Job taking each backup: created once, watched, deleted with its backup object.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Kubernetes Events about reconciliation, recorded with either events API.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
A map of labels as `key=value,...` (sorted by key), the operator's label-list flags.
*/}}
{{- define "dbservice-operator.labelList" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
