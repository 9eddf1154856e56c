{{- define "load-control.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects are shared by every release in the cluster: the namespace is part of
     the name (":" cannot occur in a namespace or release name, so two releases never collide). */}}
{{/* The leader Lease: one per release, so two releases in one namespace never share it. */}}
{{- define "load-control.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (printf "%s-leader" (include "load-control.fullname" .)) -}}
{{- end -}}

{{- define "load-control.clusterName" -}}
{{ printf "load-control:%s:%s" .Release.Namespace (include "load-control.fullname" .) }}
{{- end -}}

{{- define "load-control.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Deployment's pods only: hook pods (migration, test) carry another component, so the
     Service and the PodDisruptionBudget never select them. */}}
{{- define "load-control.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "load-control.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Service's address as kubelet injects it into pods of the namespace, so hooks work
     with or without cluster DNS. */}}
{{- define "load-control.serviceHostEnv" -}}
{{ include "load-control.fullname" . | upper | replace "-" "_" }}_SERVICE_HOST
{{- end -}}

{{- define "load-control.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ .Values.database.existingSecret | required "database.existingSecret is required: the name of a Secret in the release's namespace holding the ledger's PostgreSQL URL under database.urlKey (DATABASE_URL), e.g. kubectl create secret generic lc-db --from-literal=DATABASE_URL=postgres://USER:PASS@HOST:5432/DB, then --set database.existingSecret=lc-db" }}, key: {{ .Values.database.urlKey }}}
{{- with .Values.database.tls }}
{{- if .sslMode }}
- name: PGSSLMODE
  value: {{ .sslMode | quote }}
{{- end }}
{{- if .caSecret }}
- name: PGSSLROOTCERT
  value: /etc/load-control/database-ca/ca.crt
{{- end }}
{{- end }}
{{- if .Values.database.passwordKey }}
# The password, from a mounted file read again while running: a rotation is a `kubectl apply` of
# the Secret, no restart (docs/operations.md, "Rotating the database password").
- name: LCA_DATABASE__PASSWORD_FILE
  value: /etc/load-control/database-password/password
{{- end }}
{{- end -}}

{{/* The database CA (database.tls.caSecret) and password file (database.passwordKey): the
     volumes, and their mounts in a container that connects. The password is a directory mount
     (never subPath), so the kubelet replaces the file when the Secret changes. */}}
{{- define "load-control.databaseVolumes" -}}
{{- with .Values.database.tls }}
{{- if .caSecret }}
- name: database-ca
  secret:
    secretName: {{ .caSecret }}
    defaultMode: 0444
    items:
      - {key: {{ .caKey }}, path: ca.crt}
{{- end }}
{{- end }}
{{- with .Values.database.passwordKey }}
- name: database-password
  secret:
    secretName: {{ $.Values.database.existingSecret }}
    defaultMode: 0444
    items:
      - {key: {{ . }}, path: password}
{{- end }}
{{- end -}}

{{- define "load-control.databaseMounts" -}}
{{- if .Values.database.tls.caSecret }}
- {name: database-ca, mountPath: /etc/load-control/database-ca, readOnly: true}
{{- end }}
{{- if .Values.database.passwordKey }}
- {name: database-password, mountPath: /etc/load-control/database-password, readOnly: true}
{{- end }}
{{- end -}}

{{/* What both containers get. Credentials one of them does not use (the API tokens, the LISTEN
     DSN, the signing key) are added to that container alone, in deployment.yaml. */}}
{{- define "load-control.env" -}}
{{ include "load-control.databaseEnv" . }}
- name: LCA_CONFIG
  value: /etc/load-control/config.yaml
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: WATCH_NAMESPACES
  value: {{ join "," .Values.watchNamespaces | quote }}
- name: LOADRUN_RETENTION
  value: {{ .Values.operator.loadRunRetention | quote }}
- name: LC_LEASE_NAME
  value: {{ include "load-control.leaseName" . | quote }}
# This release's claim on the ledger database, the same for both containers: the operator claims
# it when it leads; the api-server is not ready while another release holds a fresh claim.
- name: LC_INSTALLATION
  value: {{ printf "%s/%s" .Release.Namespace (include "load-control.leaseName" .) | quote }}
- name: LC_LEASE_DURATION
  value: {{ .Values.leaderElection.leaseDuration | quote }}
- name: LC_RENEW_DEADLINE
  value: {{ .Values.leaderElection.renewDeadline | quote }}
- name: LC_RETRY_PERIOD
  value: {{ .Values.leaderElection.retryPeriod | quote }}
{{- include "load-control.instanceEnv" . }}
{{- end -}}

{{/* The instance label value when instanceSelector is on: the release name. */}}
{{- define "load-control.instanceEnv" -}}
{{- if .Values.instanceSelector }}
- name: LC_INSTANCE
  value: {{ .Release.Name | quote }}
{{- end }}
{{- end -}}

{{- define "load-control.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* The configuration file: .Values.config with the keys that other values own filled in from
     them. Setting such a key in .Values.config too would silently lose one of the two values,
     so it fails the install instead. */}}
{{- define "load-control.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $owned := dict "server.port" "api.port" "server.health_port" "api.healthPort" "worker.metrics_port" "operator.metricsPort" "worker.metrics_tls" "secrets.apiTls.existingSecret" "worker.health_port" "operator.healthPort" "database.url" "database.existingSecret" "database.listen_dsn" "database.listenDsnSecret" "database.migration_url" "database.migrationUrlKey" "auth.tokens" "auth.existingSecret" "auth.token_digests" "auth.existingSecret" "auth.tokens_file" "auth.existingSecret" "nifi.signing_secret" "secrets.signingSecret" "nifi.signing_keys" "secrets.signingKeys" "database.password_file" "database.passwordKey" "database.runtime_role" "database.runtimeRole" -}}
{{- if and .Values.secrets.signingSecret.existingSecret .Values.secrets.signingKeys.existingSecret -}}
{{- fail "secrets.signingSecret and secrets.signingKeys must not both be set: signing keys replace the signing secret (make the current secret an entry of the keys' list, with an id)" -}}
{{- end -}}
{{- range $key, $owner := $owned -}}
{{- $parts := splitList "." $key -}}
{{- $section := get $config (index $parts 0) | default dict -}}
{{- if hasKey $section (index $parts 1) -}}
{{- fail (printf "config.%s must not be set: the chart sets it from %s" $key $owner) -}}
{{- end -}}
{{- end -}}
{{- $monitor := get $config "monitor" | default dict -}}
{{- range $key, $from := dict "token" "LOADCTL_TOKEN or --token" "operator_token" "LOADCTL_OPERATOR_TOKEN or --operator-token" -}}
{{- if hasKey $monitor $key -}}
{{- fail (printf "config.monitor.%s must not be set: it is a raw token, and the ConfigMap is no place for a credential; the pods never use it, loadctl takes it from %s" $key $from) -}}
{{- end -}}
{{- end -}}
{{- $nifi := get $config "nifi" | default dict -}}
{{- $receiver := get $nifi "receiver_url" | default "" | toString -}}
{{- if not $receiver -}}
{{- fail "config.nifi.receiver_url is required: NiFi PG-05's scheme, host and port, where the operator sends VALIDATE_RUN and REISSUE_PARTITION (e.g. --set config.nifi.receiver_url=https://nifi-0.nifi.svc:9443). There is no default: a made-up address would install and then retry every dispatch for about 70 minutes before it went DEAD" -}}
{{- end -}}
{{- if and (regexMatch "^https?://[^/?#]+/[^?#]*[^/?#][^?#]*$" $receiver) (not (get $nifi "receiver_path_allowed")) -}}
{{- $origin := regexFind "^https?://[^/?#]+" $receiver -}}
{{- fail (printf "config.nifi.receiver_url %s has a path: NiFi's PG-05 answers only /validate/<jobKey> and /reissue/<jobKey> (404 under a prefix, and a 404 makes every dispatch DEAD at once). Set config.nifi.receiver_url=%s, or config.nifi.receiver_path_allowed=true when a proxy in front of NiFi strips the path" $receiver $origin) -}}
{{- end -}}
{{- $_ := set $config "server" (merge (dict "port" (int .Values.api.port)) (get $config "server" | default dict)) -}}
{{- $_ := set $config "worker" (merge (dict "metrics_port" (int .Values.operator.metricsPort)) (get $config "worker" | default dict)) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* What every series the chart's monitors scrape carries besides namespace: release="<release>"
     (helm release names are unique in a namespace), so the PrometheusRule's alerts of two
     releases in one namespace never see each other's series. */}}
{{- define "load-control.monitorRelabelings" -}}
relabelings:
  - {action: replace, targetLabel: release, replacement: {{ .Release.Name | quote }}}
{{- end -}}

{{/* The label selector every alert of the PrometheusRule uses: this release's series only. */}}
{{- define "load-control.alertSelector" -}}
{{ printf "namespace=%q, release=%q" .Release.Namespace .Release.Name }}
{{- end -}}

{{/*
A hook Job's or the test pod's scheduling: the pods' own values (priorityClassName, nodeSelector,
tolerations, affinity as set), so that a hook runs where the release's pods may run (a tainted
node pool, a dedicated zone). Not the default anti-affinity, which only spreads replicas.
*/}}
{{- define "load-control.hookScheduling" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Extra annotations of a hook's pod: podAnnotations, then hooks.podAnnotations over them (e.g.
`sidecar.istio.io/inject: "false"`, so that a mesh sidecar does not keep a Job from completing).
*/}}
{{- define "load-control.hookPodAnnotations" -}}
{{- $all := merge (deepCopy (.Values.hooks.podAnnotations | default dict)) (deepCopy (.Values.podAnnotations | default dict)) }}
{{- with $all }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Refuses to render (so `helm upgrade` stops before any hook runs) when the release's Lease says its
ledger is at a schema newer than this chart's binaries support: their migration would refuse it,
and their pods would not serve on it. The operator marks the Lease whenever it takes leadership
(operator/src/lease.rs). Without a cluster (`helm template`) there is nothing to look up and
nothing is checked; `helm rollback` renders nothing (the older migration hook refuses there).
*/}}
{{- define "load-control.ledgerSchemaCheck" -}}
{{- $lease := lookup "coordination.k8s.io/v1" "Lease" .Release.Namespace (include "load-control.leaseName" .) -}}
{{- if $lease -}}
{{- $annotations := default (dict) $lease.metadata.annotations -}}
{{- $ledger := get $annotations "load-control.io/ledger-schema-version" -}}
{{- $max := index .Chart.Annotations "load-control.io/supported-schema-max" -}}
{{- if and $ledger (gt (atoi $ledger) (atoi $max)) -}}
{{- fail (printf "the ledger is at schema version %s (its leader was %s, Lease %s/%s), and this chart (load-control %s) runs on schema versions up to %s: its migration and pods would refuse that ledger. Nothing was changed. Stay on (or upgrade to) a chart that supports schema %s, or restore the ledger from a backup taken before that schema (docs/operations.md, \"Schema versions, upgrades and rollbacks\")." $ledger (get $annotations "load-control.io/ledger-schema-written-by" | default "a newer release") .Release.Namespace (include "load-control.leaseName" .) .Chart.AppVersion $max $ledger) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* How Prometheus verifies the API's certificate (serviceMonitor.tls), and the client certificate
it presents when the API requires one: the ServiceMonitor's (the API) and the PodMonitor's (the
operator's metrics, served with the same certificate and check under worker.metrics_tls). */}}
{{- define "load-control.scrapeTlsConfig" -}}
{{- $api := .Values.secrets.apiTls }}
{{- $tls := .Values.serviceMonitor.tls }}
serverName: {{ $tls.serverName | default (printf "%s.%s.svc" (include "load-control.fullname" .) .Release.Namespace) | quote }}
{{- if and $tls.ca.secret $tls.ca.configMap }}
{{- fail "serviceMonitor.tls.ca: set secret or configMap, not both" }}
{{- else if $tls.ca.secret }}
ca:
  secret: {name: {{ $tls.ca.secret }}, key: {{ $tls.ca.key | required "serviceMonitor.tls.ca.key is required" }}}
{{- else if $tls.ca.configMap }}
ca:
  configMap: {name: {{ $tls.ca.configMap }}, key: {{ $tls.ca.key | required "serviceMonitor.tls.ca.key is required" }}}
{{- else if $tls.insecureSkipVerify }}
# serviceMonitor.tls.insecureSkipVerify: the API's certificate is not verified.
insecureSkipVerify: true
{{- else }}
{{- fail (printf "serviceMonitor.enabled with secrets.apiTls.existingSecret: the API serves HTTPS, so Prometheus needs the CA that signed its certificate. Set serviceMonitor.tls.ca.secret (or serviceMonitor.tls.ca.configMap) and serviceMonitor.tls.ca.key, e.g. --set serviceMonitor.tls.ca.secret=%s --set serviceMonitor.tls.ca.key=%s; or serviceMonitor.tls.insecureSkipVerify=true to scrape without verifying it" $api.existingSecret $api.caKey) }}
{{- end }}
{{- if $tls.clientCert.secret }}
cert:
  secret: {name: {{ $tls.clientCert.secret }}, key: {{ $tls.clientCert.certKey | required "serviceMonitor.tls.clientCert.certKey is required" }}}
keySecret: {name: {{ $tls.clientCert.secret }}, key: {{ $tls.clientCert.keyKey | required "serviceMonitor.tls.clientCert.keyKey is required" }}}
{{- else if $api.clientCertRequired }}
{{- fail "serviceMonitor.enabled with secrets.apiTls.clientCertRequired: the API refuses clients without a certificate, so Prometheus needs one signed by the CA of secrets.apiTls.clientCaKey. Set serviceMonitor.tls.clientCert.secret to a kubernetes.io/tls Secret in the release's namespace (keys serviceMonitor.tls.clientCert.certKey, keyKey; default tls.crt, tls.key)" }}
{{- end }}
{{- end -}}
