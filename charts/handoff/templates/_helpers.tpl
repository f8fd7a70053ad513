{{/*
Labels on every object: the manifests' own (app.kubernetes.io/name: handoff) and Helm's.
Selectors and pod templates carry only the manifests' labels, as in manifests/base, so that a
Deployment's immutable selector never changes with the chart's version.
*/}}
{{- define "handoff.labels" -}}
app.kubernetes.io/name: handoff
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The namespaces both webhook configurations stay out of: never in handoff's own path. */}}
{{- define "handoff.excludedNamespaces" -}}
[kube-system, {{ .Release.Namespace }}]
{{- end }}

{{/* The usernames of config.syncTargets that the kcp-syncer convention does not already send. */}}
{{- define "handoff.extraSyncers" -}}
{{- $names := list -}}
{{- range (.Values.config.syncTargets | default list) -}}
{{- $u := .username | toString -}}
{{- $parts := splitList ":" $u -}}
{{- $conventional := and (hasPrefix "system:serviceaccount:" $u) (eq (len $parts) 4) (hasPrefix "kcp-syncer-" (last $parts)) -}}
{{- if and (not $conventional) (not (has $u $names)) -}}
{{- $names = append $names $u -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end }}

{{/*
Every check a schema cannot make, each with a message that says what to change. Rendered by
templates/validate.yaml, so any install, upgrade or template fails on it.
*/}}
{{- define "handoff.validate" -}}
{{- if not (or .Values.guard.enabled .Values.pin.enabled) -}}
{{- fail "guard.enabled and pin.enabled are both false: nothing would run. Enable at least one webhook, or uninstall the release" -}}
{{- end -}}
{{- range $component := list "guard" "pin" -}}
{{- $v := index $.Values $component -}}
{{- if and $v.enabled $v.podDisruptionBudget.enabled (ge (int $v.podDisruptionBudget.minAvailable) (int $v.replicas)) -}}
{{- fail (printf "%s.podDisruptionBudget.minAvailable (%d) must be below %s.replicas (%d), or a node drain can never evict a %s pod: lower minAvailable, raise replicas, or set %s.podDisruptionBudget.enabled: false" $component (int $v.podDisruptionBudget.minAvailable) $component (int $v.replicas) $component $component) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.kcp.enabled (not .Values.guard.enabled) -}}
{{- fail "kcp.enabled needs guard.enabled: the kcp settings are the guard's (the pin reads nothing of kcp)" -}}
{{- end -}}
{{- $ca := .Values.certificate.caBundle -}}
{{- if and (eq .Values.certificate.mode "certManager") $ca -}}
{{- fail "certificate.caBundle is set but certificate.mode is certManager, whose cainjector fills the caBundle: remove certificate.caBundle, or set certificate.mode: secret" -}}
{{- end -}}
{{- if $ca -}}
{{- if hasPrefix "-----BEGIN" $ca -}}
{{- fail "certificate.caBundle is a PEM; it takes the base64 of the PEM (base64 -w0 ca.crt, or what `handoff certs` prints)" -}}
{{- end -}}
{{- if not (regexMatch "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$" $ca) -}}
{{- fail "certificate.caBundle is not base64 (one line, no spaces): give the base64 of the PEM CA certificate (base64 -w0 ca.crt)" -}}
{{- end -}}
{{- if not (hasPrefix "-----BEGIN CERTIFICATE-----" ($ca | b64dec)) -}}
{{- fail "certificate.caBundle does not decode to a PEM certificate (-----BEGIN CERTIFICATE-----): give the base64 of the CA's ca.crt" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The client configuration of one webhook entry. */}}
{{- define "handoff.clientConfig" -}}
clientConfig:
  service:
    namespace: {{ .root.Release.Namespace }}
    name: {{ .service }}
    path: {{ .path }}
    port: 443
  {{- with .root.Values.certificate.caBundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}

{{/* Annotations of both webhook configurations. */}}
{{- define "handoff.webhookAnnotations" -}}
{{- if eq .Values.certificate.mode "certManager" }}
annotations:
  # cert-manager's cainjector keeps every caBundle equal to the ca.crt of this Certificate.
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/handoff
{{- end }}
{{- end }}

{{/*
One webhook's Deployment. Called with (dict "root" $ "component" "guard"|"pin").
*/}}
{{- define "handoff.deployment" -}}
{{- $root := .root -}}
{{- $values := $root.Values -}}
{{- $v := index $values .component -}}
{{- $name := printf "handoff-%s" .component -}}
{{- $annotations := deepCopy $values.podAnnotations -}}
{{- if $values.config -}}
{{- $startup := pick $values.config "syncTargets" "annotationDomains" "keySchemes" -}}
{{- $_ := set $annotations "handoff.dev/startup-config" (toJson $startup | sha256sum) -}}
{{- end -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "handoff.labels" $root | nindent 4 }}
spec:
  replicas: {{ $v.replicas }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      app.kubernetes.io/name: handoff
      app.kubernetes.io/component: {{ .component }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # Start the new pod before stopping an old one: serving capacity never drops.
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        app.kubernetes.io/name: handoff
        app.kubernetes.io/component: {{ .component }}
      {{- with $annotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      # --drain-delay (5s) + --drain-timeout (20s) < 30s: SIGKILL never cuts a review short.
      terminationGracePeriodSeconds: 30
      {{- with $values.priorityClassName }}
      priorityClassName: {{ . | quote }}
      {{- end }}
      {{- with $values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      affinity:
        {{- if $values.affinity }}
        {{- toYaml $values.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          # Preferred, not required: required anti-affinity leaves replicas Pending on small
          # clusters and blocks a rollout's surge pod on exactly three nodes.
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/name: handoff
                    app.kubernetes.io/component: {{ .component }}
        {{- end }}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              app.kubernetes.io/name: handoff
              app.kubernetes.io/component: {{ .component }}
      containers:
        - name: handoff
          image: {{ printf "%s:%s" $values.image.repository ($values.image.tag | default $root.Chart.AppVersion) | quote }}
          imagePullPolicy: {{ $values.image.pullPolicy }}
          args:
            - serve
            - --listen
            - 0.0.0.0:8443
            - --tls-cert
            - /etc/handoff/tls/tls.crt
            - --tls-key
            - /etc/handoff/tls/tls.key
            - --metrics-listen
            - 0.0.0.0:9090
            - --log-format
            - json
            # Each webhook stands alone (docs/ARCHITECTURE.md §1.3).
            - --webhooks
            {{- if eq .component "guard" }}
            - sync-finalizer
            {{- else }}
            - move-window
            # The pin's own Deployment is never pinned (docs/ARCHITECTURE.md §1.2).
            - --own-deployment
            - $(POD_NAMESPACE)/handoff-pin
            {{- end }}
            {{- if and (eq .component "guard") (ne $root.Release.Namespace "handoff-system") }}
            # The policy parameter ConfigMap lives beside the guard (its Role is for this namespace).
            - --policy-params
            - $(POD_NAMESPACE)/handoff-sync-targets
            {{- end }}
            {{- if and (eq .component "guard") $values.kcp.enabled }}
            - --kcp-kubeconfig
            - /etc/handoff/kcp/kubeconfig
            {{- end }}
            {{- if $values.config }}
            - --config
            - /etc/handoff/config/config.yaml
            {{- end }}
            {{- range $v.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
          ports:
            - name: https
              containerPort: 8443
              protocol: TCP
            - name: metrics
              containerPort: 9090
              protocol: TCP
          # Through the same TLS listener as the API server's calls.
          livenessProbe:
            httpGet:
              path: /healthz
              port: 8443
              scheme: HTTPS
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: 8443
              scheme: HTTPS
            periodSeconds: 5
            timeoutSeconds: 2
            failureThreshold: 2
          {{- with $v.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            runAsNonRoot: true
            runAsUser: 65532
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            # Re-read when the kubelet swaps the Secret's files; no restart.
            - name: tls
              mountPath: /etc/handoff/tls
              readOnly: true
            {{- if and (eq .component "guard") $values.kcp.enabled }}
            - name: kcp-kubeconfig
              mountPath: /etc/handoff/kcp
              readOnly: true
            {{- end }}
            {{- if $values.config }}
            - name: config
              mountPath: /etc/handoff/config
              readOnly: true
            {{- end }}
      volumes:
        - name: tls
          secret:
            secretName: {{ $values.certificate.secretName }}
            defaultMode: 288 # 0440
        {{- if and (eq .component "guard") $values.kcp.enabled }}
        # A Secret the kubelet cannot mount keeps the pod from starting: the guard never runs
        # without the kcp side it was configured with.
        - name: kcp-kubeconfig
          secret:
            secretName: {{ $values.kcp.kubeconfigSecret }}
            defaultMode: 288 # 0440
        {{- end }}
        {{- if $values.config }}
        - name: config
          configMap:
            name: handoff-config
        {{- end }}
{{- end }}
