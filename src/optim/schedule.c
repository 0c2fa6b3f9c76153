/*
 * optim/schedule.c — learning-rate schedules in closed form: torch's StepLR
 * and CosineAnnealingLR (_get_closed_form_lr), with an optional LinearLR
 * warmup in front (SequentialLR semantics: the main schedule restarts at 0
 * at the milestone).
 */
#include "core/internal.h"
#include "tessera/optim.h"

#include <math.h>

ts_lr_schedule ts_lr_constant(double base_lr) {
    ts_lr_schedule s = {TS_LR_CONSTANT, base_lr, 1, 1.0, 1, 0.0, 0, 1.0 / 3.0};
    return s;
}

ts_lr_schedule ts_lr_step(double base_lr, int64_t step_size, double gamma) {
    ts_lr_schedule s = ts_lr_constant(base_lr);
    s.kind = TS_LR_STEP;
    s.step_size = step_size;
    s.gamma = gamma;
    return s;
}

ts_lr_schedule ts_lr_cosine(double base_lr, int64_t t_max, double eta_min) {
    ts_lr_schedule s = ts_lr_constant(base_lr);
    s.kind = TS_LR_COSINE;
    s.t_max = t_max;
    s.eta_min = eta_min;
    return s;
}

ts_lr_schedule ts_lr_with_warmup(ts_lr_schedule s, int64_t warmup, double start_factor) {
    s.warmup = warmup;
    s.warmup_start_factor = start_factor;
    return s;
}

ts_status ts_lr_schedule_check(const ts_lr_schedule *s) {
    TS_ARG(s, "ts_lr_schedule_check: NULL schedule");
    TS_ARG(s->kind >= TS_LR_CONSTANT && s->kind <= TS_LR_COSINE, "lr schedule: unknown kind %d", (int)s->kind);
    TS_ARG(s->base_lr >= 0, "lr schedule: base_lr %g must be >= 0", s->base_lr);
    TS_ARG(s->kind != TS_LR_STEP || s->step_size >= 1, "lr schedule: step_size %lld must be >= 1",
           (long long)s->step_size);
    TS_ARG(s->kind != TS_LR_COSINE || s->t_max >= 1, "lr schedule: T_max %lld must be >= 1", (long long)s->t_max);
    TS_ARG(s->warmup >= 0, "lr schedule: warmup %lld must be >= 0", (long long)s->warmup);
    TS_ARG(s->warmup == 0 || (s->warmup_start_factor > 0 && s->warmup_start_factor <= 1),
           "lr schedule: warmup_start_factor %g must be in (0, 1]", s->warmup_start_factor);
    return TS_OK;
}

double ts_lr_schedule_at(const ts_lr_schedule *s, int64_t t) {
    if (t < 0) t = 0;
    if (s->warmup > 0) {
        if (t < s->warmup) {
            double f = s->warmup_start_factor;
            return s->base_lr * (f + (1.0 - f) * (double)t / (double)s->warmup);
        }
        t -= s->warmup;
    }
    switch (s->kind) {
    case TS_LR_STEP:
        return s->base_lr * pow(s->gamma, (double)(t / (s->step_size > 0 ? s->step_size : 1)));
    case TS_LR_COSINE: {
        double tm = (double)(s->t_max > 0 ? s->t_max : 1);
        return s->eta_min + (s->base_lr - s->eta_min) * (1.0 + cos(M_PI * (double)t / tm)) / 2.0;
    }
    default:
        return s->base_lr;
    }
}
