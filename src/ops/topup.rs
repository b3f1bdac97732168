//! `quipu topup` and `POST /admin/topups`: adding money to a tenant's balance, with the
//! configured minimum, [`MAX_TOP_UP`](super::MAX_TOP_UP), and an optional idempotency key.

use super::tenants::tenant_id;
use super::text::{rfc3339, soles_text};
use super::{OpsError, OpsResult, Render, MAX_TOP_UP};
use crate::money::{self, Pen};
use crate::store::Store;
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopUpDone {
    pub top_up_id: String,
    pub tenant: String,
    /// Exact soles.
    pub amount: String,
    pub at: String,
    /// The balance right after (exact soles).
    pub balance: String,
    /// The idempotency key had been used before: nothing was added now, and this is the
    /// original top-up (with the balance as it is now).
    pub replayed: bool,
}

impl Render for TopUpDone {
    fn text(&self) -> String {
        if self.replayed {
            return format!(
                "Top-up {} of {} to {} was already made (same idempotency key); nothing added. Balance now {}.\n",
                self.top_up_id,
                soles_text(&self.amount),
                self.tenant,
                soles_text(&self.balance)
            );
        }
        format!(
            "Added {} to {} (top-up {}). Balance now {}.\n",
            soles_text(&self.amount),
            self.tenant,
            self.top_up_id,
            soles_text(&self.balance)
        )
    }
}

/// Parses and checks a top-up amount typed by an operator: at most two decimals, at least
/// `min_top_up`, at most [`MAX_TOP_UP`].
pub fn parse_top_up(amount_text: &str, min_top_up: Pen) -> OpsResult<Pen> {
    let amount = Pen::parse(amount_text, money::AMOUNT_DECIMALS).map_err(|e| {
        OpsError::Invalid(format!(
            "{e}; a top-up is an amount in soles with at most {} decimals, like 50.00",
            money::AMOUNT_DECIMALS
        ))
    })?;
    if amount <= Pen::ZERO {
        return Err(OpsError::Invalid(format!(
            "a top-up must be more than S/ 0.00; the minimum top-up is {}",
            min_top_up.format_soles()
        )));
    }
    if amount < min_top_up {
        return Err(OpsError::Invalid(format!(
            "{} is below the minimum top-up of {}; top up at least that much",
            amount.format_soles(),
            min_top_up.format_soles()
        )));
    }
    if amount > MAX_TOP_UP {
        return Err(OpsError::Invalid(format!(
            "{} is more than a single top-up may be ({}); split it into several top-ups",
            amount.format_soles(),
            MAX_TOP_UP.format_soles()
        )));
    }
    Ok(amount)
}

/// Tops a tenant up. With an `idempotency_key`, retrying the same top-up (a lost reply, a
/// re-sent POST) adds nothing the second time.
pub async fn top_up(
    store: &dyn Store,
    tenant_name: &str,
    amount_text: &str,
    note: &str,
    min_top_up: Pen,
    idempotency_key: Option<&str>,
) -> OpsResult<TopUpDone> {
    let amount = parse_top_up(amount_text, min_top_up)?;
    let tenant = tenant_id(store, tenant_name).await?;
    let key = idempotency_key.map(str::trim).filter(|k| !k.is_empty());
    let done = store.top_up_once(tenant, amount, note, key).await?;
    Ok(TopUpDone {
        top_up_id: done.top_up.id,
        tenant: tenant_name.to_owned(),
        amount: done.top_up.amount.to_decimal(),
        at: rfc3339(done.top_up.at),
        balance: done.balance.to_decimal(),
        replayed: done.replayed,
    })
}

#[cfg(test)]
mod tests {
    use super::super::create_tenant;
    use super::super::test_util::{mem, min};
    use super::*;

    #[test]
    fn minimum_top_up_is_refused_with_the_minimum_in_soles() {
        let e = parse_top_up("5.00", min()).unwrap_err();
        assert_eq!(e.http_status(), 400);
        assert!(e.message().contains("minimum top-up of S/ 10.00"), "{e}");
        assert!(e.message().contains("S/ 5.00"), "{e}");
        let e = parse_top_up("9.99", min()).unwrap_err();
        assert!(e.message().contains("S/ 10.00"), "{e}");
        assert_eq!(parse_top_up("10", min()).unwrap(), min());
        let e = parse_top_up("0", Pen::ZERO).unwrap_err();
        assert!(e.message().contains("more than S/ 0.00"), "{e}");
    }

    #[test]
    fn top_up_limits_and_syntax() {
        assert_eq!(
            parse_top_up("1000000.00", min()).unwrap(),
            Pen::from_centimos(100_000_000)
        );
        let e = parse_top_up("1000000.01", min()).unwrap_err();
        assert!(e.message().contains("S/ 1,000,000.00"), "{e}");
        assert!(e.message().contains("split it"), "{e}");
        let e = parse_top_up("12.345", min()).unwrap_err();
        assert!(e.message().contains("at most 2 decimals"), "{e}");
        let e = parse_top_up("1,000", min()).unwrap_err();
        assert!(e.message().contains("like 50.00"), "{e}");
        assert!(parse_top_up("-50", min()).is_err());
    }

    #[tokio::test]
    async fn top_up_adds_to_the_balance() {
        let s = mem().await;
        create_tenant(&*s, "acme").await.unwrap();
        let e = top_up(&*s, "acme", "5.00", "", min(), None)
            .await
            .unwrap_err();
        assert!(e.message().contains("S/ 10.00"), "{e}");
        let done = top_up(&*s, "acme", "1234.56", "", min(), None)
            .await
            .unwrap();
        assert_eq!(done.amount, "1234.56");
        assert_eq!(done.balance, "1234.56");
        assert!(done.text().contains("S/ 1,234.56"), "{}", done.text());
    }
}
