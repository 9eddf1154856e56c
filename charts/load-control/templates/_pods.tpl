{{/* The pods of the chart's Deployments, in either topology (values.yaml, `topology`): the
     api-server container, the operator container, the volumes each needs, and where the pods go.
     Each is written once and placed at column 0: the Deployments indent them. */}}

{{/* The Deployment of topology split that runs the operator alone: its pods only. */}}
{{- define "load-control.operatorSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The Deployment whose pods run the operator: the API's in the sidecar topology, its own in
     the split one (what the uninstall hook stops before it releases the finalizers). */}}
{{- define "load-control.operatorDeployment" -}}
{{ include "load-control.fullname" . }}{{ if eq .Values.topology "split" }}-operator{{ end }}
{{- end -}}

{{/* Every pod of the release that runs load-control (not the hooks'), in either topology. */}}
{{- define "load-control.workloadSelector" -}}
matchLabels:
  app.kubernetes.io/name: {{ .Chart.Name }}
  app.kubernetes.io/instance: {{ .Release.Name }}
matchExpressions:
  - {key: app.kubernetes.io/component, operator: In, values: [server, operator]}
{{- end -}}

{{/* The API's certificate, key and client-certificate check (secrets.apiTls), as files of the
api-tls volume: the api-server's port, and the operator's metrics port (worker.metrics_tls). */}}
{{- define "load-control.apiTlsEnv" -}}
{{- with .Values.secrets.apiTls }}
{{- if .existingSecret }}
- {name: LCA_SERVER__SSL_CERTFILE, value: /etc/load-control/tls/api/tls.crt}
- {name: LCA_SERVER__SSL_KEYFILE, value: /etc/load-control/tls/api/tls.key}
{{- if .clientCaKey }}
- {name: LCA_SERVER__SSL_CA_CERTS, value: /etc/load-control/tls/api/client-ca.crt}
- {name: LCA_SERVER__SSL_CLIENT_CERT_REQUIRED, value: {{ .clientCertRequired | quote }}}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "load-control.apiContainer" -}}
- name: api-server
  image: {{ include "load-control.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [load-control-api, serve]
  env:
    {{- include "load-control.env" . | nindent 4 }}
    # The API's token digests: the api-server checks them, the operator never does. A file
    # of the mounted Secret, re-read every server.reload_interval: `kubectl apply` of the
    # Secret reaches the running process (an environment variable never would).
    - {name: LCA_AUTH__TOKENS_FILE, value: /etc/load-control/tokens/tokens.yaml}
    {{- include "load-control.apiTlsEnv" . | nindent 4 }}
    {{- if and .Values.secrets.apiTls.existingSecret .Values.secrets.apiTls.clientCertRequired }}
    - {name: LCA_SERVER__HEALTH_PORT, value: {{ .Values.api.healthPort | quote }}}
    {{- end }}
  ports:
    - {name: http, containerPort: {{ .Values.api.port }}}
    {{- if and .Values.secrets.apiTls.existingSecret .Values.secrets.apiTls.clientCertRequired }}
    - {name: health, containerPort: {{ .Values.api.healthPort }}}
    {{- end }}
  {{- if .Values.api.drainSeconds }}
  # Kept serving after the pod is marked for deletion, until kube-proxy and the ingress
  # have taken its endpoint away: SIGTERM (and the end of accepting) only comes after.
  lifecycle:
    preStop:
      sleep: {seconds: {{ .Values.api.drainSeconds }}}
  {{- end }}
  {{- if and .Values.secrets.apiTls.existingSecret .Values.secrets.apiTls.clientCertRequired }}
  # The kubelet has no client certificate: with client certificates required, it probes
  # the plain-HTTP health port, which serves the probes only and checks what /readyz
  # checks on the API's port (the ledger, the schema, the owner claim).
  livenessProbe:
    httpGet: {path: /healthz, port: health}
    periodSeconds: 10
  readinessProbe:
    httpGet: {path: /readyz, port: health}
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 3
  {{- else }}
  livenessProbe:
    httpGet: {path: /healthz, port: http{{ if .Values.secrets.apiTls.existingSecret }}, scheme: HTTPS{{ end }}}
    periodSeconds: 10
  # /readyz commits a trivial write (bounded by 2 s): the pod leaves the Service only
  # after 15 s of a database that cannot take writes, never for a blip.
  readinessProbe:
    httpGet: {path: /readyz, port: http{{ if .Values.secrets.apiTls.existingSecret }}, scheme: HTTPS{{ end }}}
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 3
  {{- end }}
  resources: {{- toYaml .Values.api.resources | nindent 4 }}
  securityContext: {{- include "load-control.securityContext" . | nindent 4 }}
  volumeMounts:
    - {name: config, mountPath: /etc/load-control, readOnly: true}
    {{- include "load-control.databaseMounts" . | nindent 4 }}
    # Secrets mounted as directories, never with subPath: the kubelet swaps a directory's
    # files when the Secret changes (a subPath mount would keep the old ones for ever),
    # and the api-server reads them again (certificate, key, tokens).
    - {name: api-tokens, mountPath: /etc/load-control/tokens, readOnly: true}
    {{- if .Values.secrets.apiTls.existingSecret }}
    - {name: api-tls, mountPath: /etc/load-control/tls/api, readOnly: true}
    {{- end }}
{{- end -}}

{{- define "load-control.operatorContainer" -}}
- name: operator
  image: {{ include "load-control.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  # Kubernetes mode: Lease leadership in the pod's namespace, LoadJob controller, LoadRun mirror.
  # --supervise: a signal that kills the operator process (an OOM kill) is absorbed inside
  # the container, which would otherwise take the pod, and the api-server beside it, out
  # of the Service until the kubelet restarted it (docs/operations.md).
  command: [load-control-operator, --supervise]
  env:
    {{- include "load-control.env" . | nindent 4 }}
    {{- with .Values.database.listenDsnSecret }}
    {{- if .key }}
    # The dispatcher's LISTEN connection (database.listen_dsn), from its Secret: it
    # carries a password, so never in the ConfigMap.
    - name: LCA_DATABASE__LISTEN_DSN
      valueFrom:
        secretKeyRef: {name: {{ .name | default $.Values.database.existingSecret }}, key: {{ .key }}}
    {{- end }}
    {{- end }}
    {{- with .Values.secrets.signingSecret }}
    {{- if .existingSecret }}
    # The HMAC key of dispatches, from its Secret: never in the ConfigMap.
    - name: LCA_NIFI__SIGNING_SECRET
      valueFrom:
        secretKeyRef: {name: {{ .existingSecret }}, key: {{ .key }}}
    {{- end }}
    {{- end }}
    {{- with .Values.secrets.signingKeys }}
    {{- if .existingSecret }}
    # The dispatch signing keys ({id, secret} list, the first signs), from their Secret.
    - name: LCA_NIFI__SIGNING_KEYS
      valueFrom:
        secretKeyRef: {name: {{ .existingSecret }}, key: {{ .key }}}
    {{- end }}
    {{- end }}
    {{- with .Values.secrets.nifiTls }}
    {{- if .existingSecret }}
    {{- if .certKey }}
    - {name: LCA_NIFI__CLIENT_CERT, value: /etc/load-control/tls/nifi/client.crt}
    - {name: LCA_NIFI__CLIENT_KEY, value: /etc/load-control/tls/nifi/client.key}
    {{- end }}
    {{- if .caKey }}
    - {name: LCA_NIFI__CA_BUNDLE, value: /etc/load-control/tls/nifi/ca.crt}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- if .Values.secrets.apiTls.existingSecret }}
    # The operator's metrics in HTTPS as the API's are: the same certificate, key and client
    # check (worker.metrics_tls), re-read every server.reload_interval.
    {{- include "load-control.apiTlsEnv" . | nindent 4 }}
    - {name: LCA_WORKER__METRICS_TLS, value: "true"}
    {{- if .Values.secrets.apiTls.clientCertRequired }}
    - {name: LCA_WORKER__HEALTH_PORT, value: {{ .Values.operator.healthPort | quote }}}
    {{- end }}
    {{- end }}
  ports:
    - {name: metrics, containerPort: {{ .Values.operator.metricsPort }}}
    {{- if and .Values.secrets.apiTls.existingSecret .Values.secrets.apiTls.clientCertRequired }}
    - {name: operator-health, containerPort: {{ .Values.operator.healthPort }}}
    {{- end }}
  # No readiness probe: pod readiness (and so the Service's endpoints, NiFi's API) is the
  # api-server's alone. The operator never exits for what it can wait out (CRDs missing,
  # RBAC 403, API server away, no Kubernetes client yet; /healthz names it) and its
  # liveness fails only when the process is wedged (its leadership task died, or /healthz
  # does not answer): a crash-looping leader task is reported, never a restart, since a
  # restarted container takes this pod out of the Service.
  livenessProbe:
    {{- if and .Values.secrets.apiTls.existingSecret .Values.secrets.apiTls.clientCertRequired }}
    # The kubelet has no client certificate: the plain-HTTP probes port (worker.health_port).
    httpGet: {path: /healthz, port: operator-health}
    {{- else }}
    httpGet: {path: /healthz, port: metrics{{ if .Values.secrets.apiTls.existingSecret }}, scheme: HTTPS{{ end }}}
    {{- end }}
    periodSeconds: 10
    failureThreshold: 3
  resources: {{- toYaml .Values.operator.resources | nindent 4 }}
  securityContext: {{- include "load-control.securityContext" . | nindent 4 }}
  volumeMounts:
    - {name: config, mountPath: /etc/load-control, readOnly: true}
    - {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
    {{- include "load-control.databaseMounts" . | nindent 4 }}
    {{- if .Values.secrets.nifiTls.existingSecret }}
    - {name: nifi-tls, mountPath: /etc/load-control/tls/nifi, readOnly: true}
    {{- end }}
    {{- if .Values.secrets.apiTls.existingSecret }}
    - {name: api-tls, mountPath: /etc/load-control/tls/api, readOnly: true}
    {{- end }}
{{- end -}}

{{/* What both containers mount: the configuration, the database's files and the API's
certificate (the operator's metrics are served with it too). */}}
{{- define "load-control.commonVolumes" -}}
- name: config
  configMap: {name: {{ include "load-control.fullname" . }}}
{{- include "load-control.databaseVolumes" . | nindent 0 }}
{{- with .Values.secrets.apiTls }}
{{- if .existingSecret }}
- name: api-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      {{- if .clientCaKey }}
      - {key: {{ .clientCaKey }}, path: client-ca.crt}
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "load-control.apiVolumes" -}}
- name: api-tokens
  secret:
    secretName: {{ .Values.auth.existingSecret | required "auth.existingSecret is required: the name of a Secret in the release's namespace holding the api-server's tokens under auth.tokensKey (tokens.yaml), a YAML list of {name, role, sha256} (README, Install), then --set auth.existingSecret=lc-tokens" }}
    defaultMode: 0440
    items:
      - {key: {{ .Values.auth.tokensKey }}, path: tokens.yaml}
{{- end -}}

{{- define "load-control.operatorVolumes" -}}
{{- with .Values.secrets.nifiTls }}
{{- if .existingSecret }}
- name: nifi-tls
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0440
    items:
      {{- if .certKey }}
      - {key: {{ .certKey }}, path: client.crt}
      - {key: {{ .keyKey }}, path: client.key}
      {{- end }}
      {{- if .caKey }}
      - {key: {{ .caKey }}, path: ca.crt}
      {{- end }}
{{- end }}
{{- end }}
# What automounting would give every container, for the operator only: a short-lived token
# the kubelet rotates (kube-rs reads it again), the cluster CA and the namespace.
- name: kube-api-access
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
{{- end -}}

{{/* Pod placement: the scheduling values, and by default replicas of one Deployment spread over
     nodes. Called with (dict "root" $ "selector" <the name of the Deployment's selector>). */}}
{{- define "load-control.placement" -}}
{{- with .root.Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .root.Values.affinity }}
affinity: {{- toYaml .root.Values.affinity | nindent 2 }}
{{- else }}
# Default: replicas on different nodes when the cluster allows it (one node lost keeps NiFi's
# API up and a standby ready).
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels: {{- include .selector .root | nindent 14 }}
{{- end }}
{{- with .root.Values.topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
