{{- define "capkr.name" -}}capkr-controller-manager{{- end }}

{{- define "capkr.labels" -}}
cluster.x-k8s.io/provider: infrastructure-kairon
app.kubernetes.io/name: cluster-api-provider-kairon
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "capkr.selectorLabels" -}}
control-plane: capkr-controller-manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "capkr.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The permissions of config/rbac/role.yaml (a test compares them). */}}
{{- define "capkr.rules" -}}
# Our kinds: watched; finalizers and spec.providerID are patched on the objects.
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [kaironclusters, kaironmachines, kaironmachinetemplates, kaironmachinepools]
  verbs: [get, list, watch, patch]
# Status is written by server-side apply on the status subresource.
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [kaironclusters/status, kaironmachines/status, kaironmachinetemplates/status, kaironmachinepools/status]
  verbs: [get, patch]
# A KaironMachinePool makes one KaironMachine per VM of its Kairon MachineSet.
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [kaironmachines]
  verbs: [create, delete]
# CAPI MachinePools are read; spec.replicas is patched when an autoscaler owns the size.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinepools]
  verbs: [get, list, watch, patch]
# CAPI Clusters are only read.
- apiGroups: [cluster.x-k8s.io]
  resources: [clusters]
  verbs: [get, list, watch]
# CAPI MachineDeployments: listed per cluster for its disruption budgets on Kairon.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinedeployments]
  verbs: [list]
# CAPI MachineHealthChecks: watched, which of them selects a Machine on a cordoned Kairon node.
- apiGroups: [cluster.x-k8s.io]
  resources: [machinehealthchecks]
  verbs: [list, watch]
# CAPI Machines: read; marked for remediation (patch) or deleted (a MachineSet's worker without
# a MachineHealthCheck) when Kairon asks for their VM to leave a host in maintenance.
- apiGroups: [cluster.x-k8s.io]
  resources: [machines]
  verbs: [get, list, watch, patch, delete]
# Bootstrap configs (any bootstrap provider's kinds): the metadata of the config that made a
# Machine's bootstrap data Secret, to check it is that Machine's. Watched metadata-only per
# kind once met (no read per machine), read (get) while that watch lags behind.
- apiGroups: [bootstrap.cluster.x-k8s.io]
  resources: ["*"]
  verbs: [get, list, watch]
# Bootstrap data and identities (KaironCluster spec.identityRef): one GET of the one Secret
# named; patch to put a finalizer, the clusterctl move label (a Secret named directly) or an
# owner reference (a KaironClusterIdentity's Secret) on an identity Secret while the
# cluster's VMs exist. No list, no watch. The owner reference also needs `delete` under
# OwnerReferencesPermissionEnforcement: granted in the release namespace only (rbac.yaml).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, patch]
# Namespaces: the UID of kube-system is the management cluster's identity on Kairon
# (--management-cluster-id); the labels of a KaironCluster's namespace are matched against
# a KaironClusterIdentity's spec.allowedNamespaces.selector. One GET each, no list or watch.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
# Shared identities: one GET when an endpoint starts and every 30 s; patch to put a finalizer
# on one while clusters' VMs use it. No list, no watch.
- apiGroups: [infrastructure.cluster.x-k8s.io]
  resources: [kaironclusteridentities]
  verbs: [get, patch]
# Kairon Machines: created, deleted, and patched to move the adoption label after a move.
- apiGroups: [kairon.zyvor.dev]
  resources: [machines]
  verbs: [get, list, watch, create, delete, patch]
# Kairon MachineDisruptionBudgets kept per cluster (its control plane, its other VMs).
- apiGroups: [kairon.zyvor.dev]
  resources: [machinedisruptionbudgets]
  verbs: [list, create, patch, delete]
# Kairon's hosts (Nodes), read only: cordons and failure-domain labels.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
# Secure /metrics: who is asking (TokenReview) and may they (SubjectAccessReview).
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
# Events on our objects.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
