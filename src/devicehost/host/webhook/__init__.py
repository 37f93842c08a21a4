"""``devicehost webhook``: DRA claim configuration checked at admission, for every backend at once.

A validating admission webhook for ResourceClaims and ResourceClaimTemplates
(``resource.k8s.io`` v1, v1beta2, v1beta1): each ``opaque`` configuration whose driver belongs
to a loaded backend is checked with that backend's claim configuration model, as the host
checks it at prepare time, so a bad configuration is refused at ``kubectl apply`` instead of
leaving a pod in ContainerCreating.

- :mod:`.review`: the pure part, an AdmissionReview in, the decision out;
- :mod:`.drivers`: which backend answers for which driver (backends loaded and discovered once);
- :mod:`.server`: the HTTPS server, its certificate reloads and its signals;
- :mod:`.cert`: a CA and a serving certificate for clusters without cert-manager.
"""
